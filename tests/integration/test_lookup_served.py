"""Prompt lookup (`ngram`) and the hybrid (`tiny-draft+ngram`) served on the tiny models: lossless greedy
output, lookup accepted on prompts that repeat themselves, the model info and the tokenizer check."""

from __future__ import annotations

import grpc
import pytest

from inprocess.engine import SpeculativeEngine
from orchestrator.remote import ModelInfo
from orchestrator.service import check_pair
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve.models.tokenizers import TokenizerMismatchError
from specserve_client import SpecServeClient
from tests.stack import LocalStack

REPETITIVE = [
    "the cat sat on the mat. the cat sat on the mat. the cat sat on the",
    "def f(x):\n    return x\ndef f(x):\n    return x\n",
]
PROMPTS = [*REPETITIVE, "a", "import numpy as np\n"]


def reference(engine: SpeculativeEngine, prompt: str, max_tokens: int = 40) -> list[int]:
    request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0)
    return engine.generate(request).token_ids


@pytest.mark.parametrize("draft", ["ngram", "tiny-draft+ngram"])
@pytest.mark.parametrize("pipelined", [True, False])
def test_greedy_output_equals_target_only(engine: SpeculativeEngine, draft: str, pipelined: bool) -> None:
    with LocalStack(draft=draft, pipelined=pipelined) as stack, SpecServeClient(stack.address, timeout_s=60) as client:
        accepted, sources = 0, set()
        for prompt in PROMPTS:
            for k in (None, 4):  # None: adaptive k
                response = client.generate(prompt, max_tokens=40, num_speculative_tokens=k)
                assert list(response.token_ids) == reference(engine, prompt), (draft, prompt, k)
                if prompt in REPETITIVE:
                    accepted += response.stats.accepted_by_source["ngram"]
                sources |= {s for s, n in response.stats.proposed_by_source.items() if n}
        assert accepted > 0, f"{draft}: lookup never got a draft accepted on prompts that repeat themselves"
        assert sources == ({"ngram"} if draft == "ngram" else {"ngram", "model"}), sources


def test_losing_the_lookup_draft_degrades_to_target_only(engine: SpeculativeEngine) -> None:
    with LocalStack(draft="ngram") as stack, SpecServeClient(stack.address, timeout_s=60) as client:
        prompt = REPETITIVE[0]
        assert client.generate(prompt, max_tokens=40).stats.proposed > 0
        stack.stop_worker("draft")
        response = client.generate(prompt, max_tokens=40)
        assert list(response.token_ids) == reference(engine, prompt) and response.stats.proposed == 0


def test_a_lookup_draft_says_it_is_token_agnostic_and_serves_without_a_model() -> None:
    with LocalStack(draft="ngram") as stack:
        with grpc.insecure_channel(stack.addresses["draft"]) as channel:
            info = pb_grpc.DraftServiceStub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=5)
        assert info.model == "ngram" and info.token_agnostic
        assert info.tokenizer_fingerprint == "" and info.vocab_size == 0
        with SpecServeClient(stack.address) as client:
            assert client.info().draft_model == "ngram"


def test_the_hybrid_reports_its_full_name_and_the_model_tokenizer() -> None:
    with LocalStack(draft="tiny-draft+ngram") as stack:
        with grpc.insecure_channel(stack.addresses["draft"]) as channel:
            info = pb_grpc.DraftServiceStub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=5)
        assert info.model == "tiny-draft+ngram" and not info.token_agnostic and info.tokenizer_fingerprint


def test_a_token_agnostic_draft_passes_the_tokenizer_check_and_a_model_draft_does_not() -> None:
    target = ModelInfo("tiny", "a" * 64, 260, 512, frozenset({1}))
    check_pair(ModelInfo("ngram", "", 0, 0, frozenset(), token_agnostic=True), target)
    with pytest.raises(TokenizerMismatchError, match="different tokenizers"):
        check_pair(ModelInfo("other", "b" * 64, 260, 512, frozenset({1})), target)
    with pytest.raises(TokenizerMismatchError):  # an empty fingerprint without the flag is still refused
        check_pair(ModelInfo("other", "", 0, 0, frozenset()), target)


def test_the_ray_actor_serves_a_lookup_draft_without_loading_a_model() -> None:
    """deploy/actors.py's WorkerActor is a plain class: the same start-up Ray runs, without Ray."""
    import time

    from deploy.actors import FAILED, LISTENING, WorkerActor
    from specserve.config import WorkerServiceConfig
    from specserve.models.loading import ModelConfig

    actor = WorkerActor("draft", WorkerServiceConfig(ModelConfig("ngram"), host="127.0.0.1", cpu_threads=1))
    actor.start()
    try:
        deadline = time.monotonic() + 60
        while (status := actor.status())[0] != LISTENING:
            assert status[0] != FAILED and time.monotonic() < deadline, status
            time.sleep(0.05)
        with grpc.insecure_channel(status[1]) as channel:
            stub = pb_grpc.DraftServiceStub(channel)
            deadline = time.monotonic() + 60
            while True:  # listening comes before serving; a lookup draft has nothing to load
                try:
                    info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=5)
                    break
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, error
                    time.sleep(0.05)
            assert info.model == "ngram" and info.token_agnostic
    finally:
        actor.stop()


def test_the_n_gram_sizes_come_from_the_worker_config() -> None:
    from draft_service.hybrid import HybridWorker
    from draft_service.lookup import LookupConfig, LookupWorker
    from draft_service.server import make_draft_worker
    from specserve.config import WorkerServiceConfig
    from specserve.models.loading import ModelConfig

    lookup = make_draft_worker(WorkerServiceConfig(ModelConfig("ngram"), prompt_lookup_max=3, prompt_lookup_min=1))
    assert isinstance(lookup, LookupWorker) and lookup.config == LookupConfig(max_ngram=3, min_ngram=1)
    tiny = ModelConfig("tiny-draft+ngram", device="cpu", dtype="float32")
    hybrid = make_draft_worker(WorkerServiceConfig(tiny, prompt_lookup_max=2))
    assert isinstance(hybrid, HybridWorker) and hybrid.loaded.name == "tiny-draft+ngram"
    assert hybrid.config.lookup == LookupConfig(max_ngram=2, min_ngram=2) and hybrid.config.min_match == 2
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        WorkerServiceConfig(ModelConfig("ngram"), prompt_lookup_max=1, prompt_lookup_min=2)
