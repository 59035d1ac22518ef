"""The target's KV caches in a preallocated pool (models/slot_cache.py, the static cache CUDA graphs will
need) give exactly the growing cache's logits and outputs in float32 on the CPU, batched or not, also
for a session that outgrows its slot."""

from __future__ import annotations

import torch

from draft_service.worker import DraftWorker
from specserve.core.loop import SpeculativeDecoder, StopConditions
from specserve.core.types import Proposal, SamplingParams
from specserve.models.loading import LoadedModel
from specserve.models.slot_cache import SlotCacheConfig, SlotSequence
from target_service.worker import TargetWorker, VerifyCall

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[5, 17, 99, 200, 31], [104, 101, 108, 108, 111, 32], [1], list(range(40, 90))]


def slot_worker(target: LoadedModel, tokens_per_slot: int = 512) -> TargetWorker:
    return TargetWorker(target, slot_cache=SlotCacheConfig(enabled=True, slots=8, tokens_per_slot=tokens_per_slot))


def generate(target_worker: TargetWorker, draft_worker: DraftWorker, prompt: list[int], k: int) -> list[int]:
    target_session = target_worker.open_session(prompt)
    draft_session = draft_worker.open_session(prompt)
    target_session.prefill()
    draft_session.prefill()
    decoder = SpeculativeDecoder(draft_session, target_session, num_prompt_tokens=len(prompt), k=k,
                                 sampling=GREEDY, stop=StopConditions(max_tokens=48), max_context=512)  # fmt: skip
    for _ in decoder.rounds():
        pass
    return decoder.result.token_ids


def test_sessions_sit_in_the_pool(tiny_target: LoadedModel) -> None:
    session = slot_worker(tiny_target).open_session(PROMPTS[0])
    assert isinstance(session.sequence, SlotSequence)


def test_speculative_outputs_equal_the_growing_caches(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    draft = DraftWorker(tiny_draft)
    for k in (0, 4):
        for prompt in PROMPTS:
            expected = generate(TargetWorker(tiny_target), draft, prompt, k)
            assert generate(slot_worker(tiny_target), draft, prompt, k) == expected, (k, prompt)


def test_window_logits_are_bit_identical(tiny_target: LoadedModel) -> None:
    plain, pooled = TargetWorker(tiny_target), slot_worker(tiny_target)
    for prompt in PROMPTS:
        sessions = [worker.open_session(prompt) for worker in (plain, pooled)]
        for session in sessions:
            session.prefill()
        for window in ([7, 8, 9, 10], [3], [200, 201]):
            logits = []
            for session in sessions:
                num_context = session.begin(Proposal(window, None, "model"))
                logits.append(session.sequence.feed(len(window) + 1))
                session.sequence.truncate(num_context + 1)  # the first draft accepted,
                session.sequence.token_ids.append(42)  # then the target's own token, pending
            assert torch.equal(logits[0], logits[1])


def test_batched_verification_and_outgrowing_a_slot(tiny_target: LoadedModel) -> None:
    plain, pooled = TargetWorker(tiny_target), slot_worker(tiny_target, tokens_per_slot=58)
    verdicts = {}
    for name, worker in (("plain", plain), ("pooled", pooled)):
        for i, prompt in enumerate(PROMPTS):
            worker.prefill(f"s{i}", prompt)
        rounds = []
        for step in range(6):  # the 50-token prompt outgrows its 58-token slot in round 5
            calls = [VerifyCall(f"s{i}", Proposal([(step * 7 + i) % 250] * 4, None, "model"), GREEDY)
                     for i in range(len(PROMPTS))]  # fmt: skip
            rounds.append([(v.token_ids, v.num_accepted) for v in worker.verify_batch(calls)])  # type: ignore[union-attr]
        verdicts[name] = rounds
    assert not isinstance(pooled.sessions.get("s3").sequence, SlotSequence)  # moved to a growing cache
    for plain_round, pooled_round in zip(verdicts["plain"], verdicts["pooled"]):
        assert [v[1] for v in plain_round] == [v[1] for v in pooled_round]
        assert [v[0][:-1] for v in plain_round] == [v[0][:-1] for v in pooled_round]
