"""The draft's slot pool and its batched steps (CUDA graphs on a GPU; the same pass eagerly here): the logits
of growing caches, the proposals of the plain draft worker, and sessions that do not fit a slot."""

from __future__ import annotations

import gc

import pytest
import torch

from draft_service.worker import DraftWorker, ProposeCall
from specserve.bench.synthetic import lockstep
from specserve.core.types import SamplingParams
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence
from specserve.models.slot_cache import SlotCacheConfig, SlotPool, SlotSequence
from specserve.models.step_graphs import StepGraphs
from target_service.worker import TargetWorker

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], list(range(10, 40)), [200, 201, 202, 203]]
IN_SLOTS = SlotCacheConfig(enabled=True, slots=4, tokens_per_slot=512)


def test_batched_steps_over_slots_give_the_logits_of_growing_caches(tiny_draft: LoadedModel) -> None:
    model, decoder = tiny_draft.model, tiny_draft.decoder
    assert decoder is not None
    pool = SlotPool(model, IN_SLOTS)
    steps = StepGraphs(model, pool, cuda_graphs=True)  # no CUDA here: the same pass, eagerly
    prompts = [*PROMPTS[:3], [(3 * j) % 250 for j in range(250)]]  # the last grows past the first length bucket
    growing = [CachedSequence(model, p, decoder) for p in prompts]
    in_slots = [SlotSequence(model, p, decoder, pool, pool.acquire()) for p in prompts]  # type: ignore[arg-type]
    for a, b in zip(growing, in_slots):
        a.prefill(), b.prefill()
    # each round: roll back (all but the first sequence), add one or two tokens (a catch-up), step
    for round_ in range(40):
        for i, (a, b) in enumerate(zip(growing, in_slots)):
            keep = len(a.token_ids) - (i + round_) % 3 if i else len(a.token_ids)
            new = [(round_ * 7 + i) % 250, 3][: 1 + (round_ + i) % 2]
            for s in (a, b):
                s.truncate(keep)
                s.token_ids.extend(new)
        expected = [s.feed(1)[-1] for s in growing]
        out = steps.step(in_slots)
        for row, e in enumerate(expected):
            torch.testing.assert_close(out.logits[row], e, atol=1e-4, rtol=1e-4)
            assert out.greedy_ids[row] == int(e.argmax())
            assert out.greedy_probs[row] == pytest.approx(float(torch.softmax(e, -1).max()), abs=1e-5)
        assert [s.num_cached for s in in_slots] == [s.num_cached for s in growing]
    assert max(len(s.token_ids) for s in in_slots) > 256


def _rounds(worker: DraftWorker, sampling: SamplingParams) -> list[list[int]]:
    """Drafts of a few rounds of every prompt, proposed together, each round keeping part of the last."""
    for i, prompt in enumerate(PROMPTS):
        worker.prefill(f"s{i}", prompt, seed=i)
    drafted, kept = [], {f"s{i}": (len(p), [5 + i]) for i, p in enumerate(PROMPTS)}
    for round_ in range(6):
        calls = [
            ProposeCall(sid, n, new, 1 + (round_ + i) % 5, sampling) for i, (sid, (n, new)) in enumerate(kept.items())
        ]
        for call, proposal in zip(calls, worker.propose_batch(calls)):
            assert not isinstance(proposal, Exception), proposal
            drafted.append(proposal.token_ids)
            keep = call.num_kept + len(call.new_token_ids) + len(proposal.token_ids) // 2
            kept[call.session_id] = (keep, [(keep * 3) % 250])
    return drafted


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)], ids=["greedy", "T0.8"]
)
def test_a_draft_in_slots_proposes_what_growing_caches_propose(tiny_draft: LoadedModel, sampling) -> None:
    in_slots = DraftWorker(tiny_draft, slot_cache=IN_SLOTS)
    expected = _rounds(DraftWorker(tiny_draft), sampling)
    assert _rounds(in_slots, sampling) == expected
    assert all(isinstance(in_slots.sessions.get(f"s{i}").sequence, SlotSequence) for i in range(len(PROMPTS)))


def test_sessions_that_do_not_fit_the_pool_keep_growing_caches(tiny_draft: LoadedModel) -> None:
    worker = DraftWorker(tiny_draft, slot_cache=SlotCacheConfig(enabled=True, slots=2, tokens_per_slot=40))
    pool = worker.runner.pool
    assert pool is not None
    for i, prompt in enumerate(PROMPTS[:3]):  # the third finds the pool full
        worker.prefill(f"s{i}", prompt)
    kinds = [type(worker.sessions.get(f"s{i}").sequence) for i in range(3)]
    assert kinds == [SlotSequence, SlotSequence, CachedSequence] and pool.num_free == 0
    worker.release("s0")
    assert pool.num_free == 1
    worker.sessions.pop("s1")  # evicted, not released: the slot comes back when the session is collected
    gc.collect()
    assert pool.num_free == 2
    worker.prefill("long", PROMPTS[2])  # 30 tokens: fits a slot of 40 until the drafts overflow it
    reference = DraftWorker(tiny_draft)
    reference.prefill("long", PROMPTS[2])
    for n in (30, 36, 42):
        call = ProposeCall("long", n, [7], 5, SamplingParams())
        assert worker.propose_batch([call]) == reference.propose_batch([call])
    assert isinstance(worker.sessions.get("long").sequence, CachedSequence) and pool.num_free == 2


def test_an_unmanaged_session_that_outgrows_its_slot_moves_to_a_growing_cache(tiny_draft: LoadedModel) -> None:
    sessions = [
        worker.open_session(PROMPTS[2])  # 30 tokens: the third round's drafts overflow a slot of 40
        for worker in (DraftWorker(tiny_draft, slot_cache=SlotCacheConfig(enabled=True, slots=1, tokens_per_slot=40)),
                       DraftWorker(tiny_draft))
    ]  # fmt: skip
    drafted: list[list[list[int]]] = [[], []]
    for session, out in zip(sessions, drafted):
        session.prefill()
        for _ in range(3):
            out.append(session.propose(5, SamplingParams()).token_ids)
            session.commit(len(session.sequence.token_ids), [7])
    assert drafted[0] == drafted[1] and isinstance(sessions[0].sequence, CachedSequence)


@pytest.mark.parametrize("k", [1, 4])
def test_sessions_drafted_in_slots_give_target_only_output(
    tiny_target: LoadedModel, tiny_draft: LoadedModel, k: int
) -> None:
    target = TargetWorker(tiny_target)
    reference, _, _, _ = lockstep(target, None, PROMPTS, 0, 40, 0.0, None)
    outputs, _, proposed, accepted = lockstep(
        target, DraftWorker(tiny_draft, slot_cache=IN_SLOTS), PROMPTS, k, 40, 0.0, None
    )
    assert outputs == reference and 0 < accepted <= proposed
