"""The served stack on the tiny models: draft, target and orchestrator over real gRPC on loopback."""

from __future__ import annotations

import concurrent.futures
import math

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve_client import SpecServeClient
from tests.stack import LocalStack

PROMPTS = ["def f(", "a", "The quick brown fox", "import numpy as np\n", "x = [1, 2, 3]\nfor i in x:\n"]


@pytest.fixture(scope="module")
def stack() -> LocalStack:
    with LocalStack() as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> SpecServeClient:
    with SpecServeClient(stack.address, timeout_s=60) as c:
        yield c


def reference(engine: SpeculativeEngine, prompt: str, max_tokens: int = 40) -> list[int]:
    request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0)
    return engine.generate(request).token_ids


@pytest.mark.parametrize("k", [0, 1, 4, 8, None])  # None: the server's default, adaptive k
def test_greedy_over_grpc_equals_target_only(client: SpecServeClient, engine: SpeculativeEngine, k: int | None) -> None:
    for prompt in PROMPTS:
        response = client.generate(prompt, max_tokens=40, num_speculative_tokens=k)
        assert list(response.token_ids) == reference(engine, prompt), (prompt, k)
        assert response.finish_reason in ("length", "eos")
        if k:
            assert response.stats.proposed > 0 and 0 <= response.stats.acceptance_rate <= 1


def test_unpipelined_stack_gives_the_same_output(engine: SpeculativeEngine) -> None:
    with LocalStack(pipelined=False) as plain, SpecServeClient(plain.address) as client:
        for prompt in PROMPTS[:3]:
            assert list(client.generate(prompt, max_tokens=40).token_ids) == reference(engine, prompt)


def test_stream_concatenates_to_the_unary_result(client: SpecServeClient) -> None:
    for prompt in PROMPTS[:3]:
        unary = client.generate(prompt, max_tokens=40, stop=["\n\n"])
        chunks = list(client.stream(prompt, max_tokens=40, stop=["\n\n"]))
        assert "".join(c.text for c in chunks) == unary.text
        assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
        assert chunks[-1].finish_reason == unary.finish_reason and chunks[-1].HasField("stats")
        assert all(not c.finish_reason for c in chunks[:-1])


def test_sampling_with_a_seed_is_reproducible(client: SpecServeClient) -> None:
    runs = [client.generate("def f(", max_tokens=30, temperature=1.0, top_k=20, seed=7) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids
    other = client.generate("def f(", max_tokens=30, temperature=1.0, top_k=20, seed=8)
    assert other.token_ids != runs[0].token_ids  # a different seed gives a different stream


def test_concurrent_clients_all_get_correct_answers(stack: LocalStack, engine: SpeculativeEngine) -> None:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]

    def one(prompt: str) -> list[int]:
        with SpecServeClient(stack.address) as c:
            return list(c.generate(prompt, max_tokens=30).token_ids)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(one, prompts))
    assert outputs == [reference(engine, p, 30) for p in prompts]


BAD_REQUESTS = [
    ({"prompt": ""}, "exactly one of prompt and messages"),
    ({"prompt": "x", "messages": [pb.ChatMessage(role="user", content="y")]}, "exactly one"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "temperature": math.nan}, "temperature"),
    ({"prompt": "x", "top_p": 0.0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": -1}, "top_k"),
    ({"prompt": "x", "num_speculative_tokens": 33}, "num_speculative_tokens"),
    ({"prompt": "x", "num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"prompt": "x" * 600}, "context holds"),
    ({"prompt": "x" * 500, "max_tokens": 40}, "does not fit"),
    ({"prompt": "x", "stop": [""]}, "stop strings"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_REQUESTS)
def test_bad_input_is_invalid_argument_and_the_server_keeps_serving(
    client: SpecServeClient, fields: dict, message: str
) -> None:
    for call in (client.stub.Generate, lambda r, timeout: list(client.stub.GenerateStream(r, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as raised:
            call(pb.GenerateRequest(**fields), timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
        assert message in raised.value.details()
    assert client.generate("ok", max_tokens=3).finish_reason


def test_unknown_sessions_are_not_found(stack: LocalStack) -> None:
    with grpc.insecure_channel(stack.addresses["target"]) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            pb_grpc.TargetServiceStub(channel).Verify(pb.VerifyRequest(session_id="nope"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    with grpc.insecure_channel(stack.addresses["draft"]) as channel:
        request = pb.ProposeRequest(session_id="nope", k=2, sampling=pb.SamplingParams(top_p=1.0))
        with pytest.raises(grpc.RpcError) as raised:
            pb_grpc.DraftServiceStub(channel).Propose(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_and_reflection_answer(stack: LocalStack) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for name, service in [
        ("orchestrator", "specserve.v1.Orchestrator"),
        ("draft", "specserve.v1.DraftService"),
        ("target", "specserve.v1.TargetService"),
    ]:
        with grpc.insecure_channel(stack.addresses[name]) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = {s.name for r in responses for s in r.list_services_response.service}
            assert service in names


def test_server_info(client: SpecServeClient) -> None:
    info = client.info()
    assert (info.target_model, info.draft_model, info.default_num_speculative_tokens) == ("tiny", "tiny-draft", 4)
    assert (info.adaptive, info.max_adaptive_num_speculative_tokens) == (True, 8)  # the default: adaptive 0..8
    assert len(info.tokenizer_fingerprint) == 64


def test_losing_the_draft_mid_request_degrades_to_target_only(engine: SpeculativeEngine) -> None:
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        stream = client.stream("def f(", max_tokens=200, ignore_eos=True, num_speculative_tokens=4)
        first = next(stream)
        stack.stop_worker("draft")
        rest = list(stream)
        token_ids = list(first.token_ids) + [t for c in rest for t in c.token_ids]
        expected = engine.generate(
            GenerationRequest(prompt="def f(", max_tokens=200, num_speculative_tokens=0, ignore_eos=True)
        ).token_ids
        assert token_ids == expected
        # a restarted draft serves new requests again
        stack.start_worker("draft", port=int(stack.addresses["draft"].rsplit(":", 1)[1]))
        response = client.generate("def f(", max_tokens=20)
        assert list(response.token_ids) == expected[:20]


def _raw_generate(address: str, payload: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/specserve.v1.Orchestrator/Generate",
            request_serializer=lambda b: b,
            response_deserializer=pb.GenerateResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as raised:
            call(payload, timeout=10)
        return raised.value


def test_invalid_utf8_and_malformed_bytes_are_refused(stack: LocalStack, client: SpecServeClient) -> None:
    prompt_field = b"\x0a\x03\xff\xfe\xfd"  # field 1 (prompt), 3 bytes that are not UTF-8
    error = _raw_generate(stack.address, prompt_field)
    assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), error
    error = _raw_generate(stack.address, b"\xff\xff\xff\xff")  # not a protobuf message at all
    assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), error
    assert client.generate("still serving", max_tokens=3).finish_reason


def test_oversized_messages_are_refused(stack: LocalStack, client: SpecServeClient) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        client.generate("x" * (9 << 20), max_tokens=3)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.generate("still serving", max_tokens=3).finish_reason


@pytest.mark.parametrize("role_name", ["draft", "target"])
def test_a_worker_loads_its_model_on_the_thread_that_runs_its_passes(role_name: str) -> None:
    """With OpenMP every thread that runs parallel torch work owns a team of threads; more of them than
    cores make libgomp sleep between parallel regions instead of spinning, which slowed every pass of a
    worker that loaded on another thread by 12-30% on two cores."""
    import asyncio
    import threading
    from dataclasses import replace

    from draft_service.server import DRAFT
    from specserve.config import WorkerServiceConfig
    from specserve.models.loading import ModelConfig
    from specserve.worker.serve import serve
    from target_service.server import TARGET

    role = DRAFT if role_name == "draft" else TARGET
    loaded_on: list[int] = []
    servicers: list[object] = []

    def make_worker(config: WorkerServiceConfig) -> object:
        loaded_on.append(threading.get_ident())
        return role.make_worker(config)

    class RecordedServicer(role.servicer):  # type: ignore[name-defined, misc]
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            servicers.append(self)

    async def serve_and_ask() -> int:
        stop = asyncio.Event()
        config = WorkerServiceConfig(ModelConfig("tiny-draft" if role_name == "draft" else "tiny"))
        recorded = replace(role, servicer=RecordedServicer, make_worker=make_worker)
        server = asyncio.create_task(serve(recorded, config, stop=stop))
        while not loaded_on or not servicers or servicers[0]._worker is None:
            assert not server.done(), server.result()
            await asyncio.sleep(0.02)
        passes_on = await servicers[0].executor.run(threading.get_ident)
        stop.set()
        await server
        return passes_on

    assert loaded_on == [asyncio.run(serve_and_ask())]
