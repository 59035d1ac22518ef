"""The target's prefill chooses the first output token in its last pass, so that it reaches the client
without waiting for a round: the greedy token of the whole prompt, or a draw from the target's distribution;
the session goes on after it. A draft refuses to choose one."""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
import torch

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.core.types import SamplingParams
from specserve.core.verify import logits_to_probs
from specserve.models.loading import LoadedModel
from specserve_client import SpecServeClient
from tests.helpers import normalize, tv_bound, tv_distance
from tests.integration.test_adaptive_served import Recorder
from tests.stack import LocalStack

CHUNK = 8  # the workers' prefill chunk: prompts shorter, as long as and longer than one, and several
GREEDY = pb.SamplingParams(temperature=0.0, top_p=1.0)


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder(methods=("Prefill", "Verify"))


@pytest.fixture(scope="module")
def stack(recorder: Recorder) -> LocalStack:
    with LocalStack(workers={"prefill_chunk_tokens": CHUNK}, interceptors={"target": [recorder]}) as running:
        yield running


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> pb_grpc.TargetServiceStub:
    with grpc.insecure_channel(stack.addresses["target"]) as channel:
        yield pb_grpc.TargetServiceStub(channel)


def _prompt(tiny_target: LoadedModel, length: int) -> list[int]:
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    token_ids = tiny_target.tokenizer(text * 4, add_special_tokens=False)["input_ids"]
    return token_ids[:length]


@torch.inference_mode()
def _next_logits(tiny_target: LoadedModel, token_ids: list[int]) -> torch.Tensor:
    """The target's logits after `token_ids`, from one pass over all of them: no cache, no chunks."""
    return tiny_target.model(torch.tensor([token_ids])).logits[0, -1].float()


@pytest.mark.parametrize("length", [1, 5, CHUNK, CHUNK + 1, 3 * CHUNK + 2])
def test_the_greedy_first_token_is_the_target_s_and_the_session_goes_on_after_it(
    target: pb_grpc.TargetServiceStub, tiny_target: LoadedModel, length: int
) -> None:
    prompt = _prompt(tiny_target, length)
    first = int(_next_logits(tiny_target, prompt).argmax())
    second = int(_next_logits(tiny_target, [*prompt, first]).argmax())
    session_id = f"greedy-{length}"
    request = pb.PrefillRequest(session_id=session_id, prompt_token_ids=prompt, first_token=GREEDY)
    assert target.Prefill(request, timeout=30).first_token_id == first
    verdict = target.Verify(pb.VerifyRequest(session_id=session_id, sampling=GREEDY), timeout=30)
    assert list(verdict.token_ids) == [second]
    # without first_token the prefill chooses nothing: the last prompt token waits for the first Verify
    request = pb.PrefillRequest(session_id=f"{session_id}-plain", prompt_token_ids=prompt)
    assert not target.Prefill(request, timeout=30).HasField("first_token_id")
    verdict = target.Verify(pb.VerifyRequest(session_id=f"{session_id}-plain", sampling=GREEDY), timeout=30)
    assert list(verdict.token_ids) == [first]


def test_the_sampled_first_token_follows_the_target_s_distribution(
    target: pb_grpc.TargetServiceStub, tiny_target: LoadedModel
) -> None:
    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt = _prompt(tiny_target, CHUNK + 3)
    exact = logits_to_probs(_next_logits(tiny_target, prompt)[None], sampling)[0]
    reference = {i: float(p) for i, p in enumerate(exact.tolist()) if p > 0}
    assert len(reference) == 3 and max(reference.values()) < 0.9  # a greedy choice would be far off
    num_runs = 1500
    counts: Counter[int] = Counter()
    for seed in range(num_runs):
        request = pb.PrefillRequest(
            session_id=f"sampled-{seed}", prompt_token_ids=prompt, seed=seed,
            first_token=pb.SamplingParams(temperature=1.0, top_p=1.0, top_k=3),
        )  # fmt: skip
        counts[target.Prefill(request, timeout=30).first_token_id] += 1
        target.Release(pb.ReleaseRequest(session_id=f"sampled-{seed}"), timeout=30)
    assert tv_distance(normalize(counts), reference) <= tv_bound(reference, num_runs)


def test_a_draft_refuses_to_choose_a_first_token(stack: LocalStack, tiny_target: LoadedModel) -> None:
    with grpc.insecure_channel(stack.addresses["draft"]) as channel:
        draft = pb_grpc.DraftServiceStub(channel)
        request = pb.PrefillRequest(session_id="d", prompt_token_ids=_prompt(tiny_target, 4), first_token=GREEDY)
        with pytest.raises(grpc.RpcError) as raised:
            draft.Prefill(request, timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "first_token" in raised.value.details()
        request.ClearField("first_token")
        assert not draft.Prefill(request, timeout=30).HasField("first_token_id")  # and it keeps serving


@pytest.mark.parametrize("k", [0, 4])
def test_a_request_s_first_token_needs_no_round(stack: LocalStack, recorder: Recorder, k: int) -> None:
    """One token asked for: the target's prefill gives it, and no Verify runs."""
    recorder.calls.clear()
    with SpecServeClient(stack.address) as client:
        response = client.generate("def f(", max_tokens=1, num_speculative_tokens=k)
        assert len(response.token_ids) == 1
        assert [method for method, _, _ in recorder.calls] == ["Prefill"]
        ((_, _, answer),) = recorder.calls
        assert answer.first_token_id == response.token_ids[0]
        streamed = list(client.stream("def f(", max_tokens=6, num_speculative_tokens=k, ignore_eos=True))
        assert list(streamed[0].token_ids) == [response.token_ids[0]]  # a chunk of its own, before any round
