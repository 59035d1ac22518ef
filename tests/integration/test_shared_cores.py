"""A draft and a target on the same CPU cores: rounds run in turn (no pre-drafts), the draft on every core
while that is faster (tried first; specserve/worker/threads.py), its windows ending on low confidence;
with company the sessions take turns, drafting together and verifying together, never both at once.
Every worker in these tests shares this machine's cores."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Iterator

import grpc
import pytest
import torch

from draft_service.servicer import DraftServicer
from draft_service.worker import DraftWorker, ProposeCall
from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.core.types import SamplingParams
from specserve.models.loading import LoadedModel
from specserve.placement import Placement, this_process, usable_cpu_count
from specserve_client import SpecServeClient
from tests.integration.test_adaptive_served import Recorder
from tests.integration.test_grpc_stack import PROMPTS, reference
from tests.stack import LocalStack

YIELD = {"yield_shared_cores": True}  # the default; tests.stack.LocalStack turns it off


@pytest.fixture(autouse=True)
def _one_thread_after() -> Iterator[None]:
    """A draft given every core sets torch's thread count, which threads started later inherit."""
    yield
    torch.set_num_threads(1)


def test_cores_are_shared_on_one_machine_only_and_only_on_the_cpu() -> None:
    here = Placement("boot-a", "cpu", frozenset({0, 1, 2, 3}))
    assert here.shares_cores_with(Placement("boot-a", "cpu", frozenset({3, 4})))
    assert not here.shares_cores_with(Placement("boot-a", "cpu", frozenset({4, 5})))  # pinned apart
    assert not here.shares_cores_with(Placement("boot-b", "cpu", frozenset({0, 1})))  # another machine
    assert not here.shares_cores_with(Placement("boot-a", "cuda:0", frozenset({0, 1})))  # a GPU draft


def test_workers_say_where_they_compute() -> None:
    with LocalStack() as stack:
        for name in ("draft", "target"):
            with grpc.insecure_channel(stack.addresses[name]) as channel:
                stub = pb_grpc.DraftServiceStub(channel) if name == "draft" else pb_grpc.TargetServiceStub(channel)
                placement = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10).placement
            assert placement.device == "cpu" and placement.host == this_process("cpu").host
            assert set(placement.cpus) == os.sched_getaffinity(0)


def test_a_lone_session_runs_its_rounds_in_turn_with_the_draft_on_every_core(
    engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads_used, recorder = _record_draft_threads(monkeypatch), Recorder()
    with _yielding_stack(recorder) as client:
        num_rounds = 0
        for prompt in PROMPTS[:3]:
            response = client.generate(prompt, max_tokens=40, num_speculative_tokens=4)
            assert list(response.token_ids) == reference(engine, prompt)
            assert response.stats.proposed > 0 and response.stats.draft_hidden_ms == 0
            num_rounds += response.stats.proposed_at_position[0]  # rounds that drafted
    proposes = [call for method, call, _ in recorder.calls if method == "Propose"]
    assert len(proposes) == num_rounds  # one proposal a round: no pre-drafts
    assert all(call.target_idle for call in proposes)
    # rounds in turn end their windows on the draft's low confidence (OrchestratorConfig)
    assert all(call.confidence_threshold == pytest.approx(0.4) for call in proposes)
    assert threads_used[0] == usable_cpu_count() and set(threads_used) <= {1, usable_cpu_count()}


def test_alone_the_draft_prefills_in_the_first_draft_turn_not_beside_the_targets_prefill(
    engine: SpeculativeEngine,
) -> None:
    """On the target's cores the draft's prefill would slow the target's, which chooses the first token: a
    session alone on the target prefills its draft in its first draft turn."""
    drafts, targets = Recorder(), Recorder(("Prefill",))
    stack = LocalStack(orchestrator=YIELD, interceptors={"draft": [drafts], "target": [targets]})
    with stack, SpecServeClient(stack.address) as client:
        for prompt in PROMPTS[:2]:
            response = client.generate(prompt, max_tokens=20, num_speculative_tokens=4)
            assert list(response.token_ids) == reference(engine, prompt, max_tokens=20)
    draft_prefills, target_prefills = drafts.spans_of("Prefill"), targets.spans_of("Prefill")
    assert len(draft_prefills) == len(target_prefills) == 2
    assert all(target_end <= draft_start for (_, target_end), (draft_start, _) in zip(target_prefills, draft_prefills))


def test_with_company_the_sessions_take_turns_drafting_and_verifying_together(
    engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads_used, recorder, verifies = _record_draft_threads(monkeypatch), Recorder(), Recorder(("Verify", "Prefill"))
    stack = LocalStack(orchestrator=YIELD, interceptors={"draft": [recorder], "target": [verifies]})
    with stack, SpecServeClient(stack.address) as client, concurrent.futures.ThreadPoolExecutor(4) as pool:
        generate = lambda p: client.generate(p, max_tokens=60, num_speculative_tokens=4)  # noqa: E731
        responses = list(pool.map(generate, PROMPTS[:4]))
    for prompt, response in zip(PROMPTS[:4], responses):
        assert list(response.token_ids) == reference(engine, prompt, max_tokens=60)
    proposes = [(call, answer) for method, call, answer in recorder.calls if method == "Propose"]
    assert len(proposes) == sum(r.stats.proposed_at_position[0] for r in responses)  # no pre-drafts
    assert all(call.target_idle and call.confidence_threshold == pytest.approx(0.4) for call, _ in proposes)
    assert threads_used[0] == usable_cpu_count() and set(threads_used) <= {1, usable_cpu_count()}
    assert max(answer.batch_size for _, answer in proposes) > 1  # the sessions drafted together
    # never at once; a target's prefill takes a verify turn (and a draft's runs beside it, or alone on the
    # target, in the session's first draft turn)
    drafting = recorder.spans_of("Propose")
    verifying = verifies.spans_of("Verify") + verifies.spans_of("Prefill")
    assert drafting and verifying and len(recorder.spans_of("Prefill")) == len(verifies.spans_of("Prefill")) == 4
    assert not any(d0 < v1 and v0 < d1 for d0, d1 in drafting for v0, v1 in verifying)


def test_the_draft_takes_every_core_only_for_a_batch_whose_targets_all_wait(tiny_draft: LoadedModel) -> None:
    servicer = DraftServicer()
    servicer.attach(DraftWorker(tiny_draft))
    for i in range(2):
        servicer.worker.prefill(f"s{i}", [1, 2, 3])
    waiting, busy = (ProposeCall(f"s{i}", 3, [4], 2, SamplingParams(), target_idle=i == 0) for i in range(2))
    try:
        servicer.propose_batch([waiting])
        assert torch.get_num_threads() == max(1, usable_cpu_count())
        servicer.propose_batch([ProposeCall("s0", 5, [4], 2, SamplingParams(), target_idle=True), busy])
        assert torch.get_num_threads() == 1
    finally:
        servicer.executor.shutdown()


@contextlib.contextmanager
def _yielding_stack(recorder: Recorder) -> Iterator[SpecServeClient]:
    """The tiny stack with the default shared-cores behaviour, the draft's calls recorded."""
    with (
        LocalStack(orchestrator=YIELD, interceptors={"draft": [recorder]}) as stack,
        SpecServeClient(stack.address) as client,
    ):
        yield client


def _record_draft_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """torch's thread count at each of the draft's batches, read on its model thread."""
    threads_used: list[int] = []
    propose_batch = DraftWorker.propose_batch

    def recording(self: DraftWorker, calls: list[ProposeCall]) -> list[object]:
        threads_used.append(torch.get_num_threads())
        return propose_batch(self, calls)

    monkeypatch.setattr(DraftWorker, "propose_batch", recording)
    return threads_used
