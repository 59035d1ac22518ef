"""After speculation with rejections, each session's KV cache equals a fresh prefill of its kept tokens."""

from __future__ import annotations

import pytest
import torch

from draft_service.worker import DraftSession, DraftWorker
from specserve.core.loop import GenerationResult, SpeculativeDecoder, StopConditions
from specserve.core.types import SamplingParams
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence
from target_service.worker import TargetSession, TargetWorker

PROMPT = [100, 101, 102, 32, 102, 40]  # "def f("
ATOL = 1e-5  # fp32: one-pass vs incremental attention differ only by reduction order (~1e-7 here)


def assert_cache_matches_fresh_prefill(sequence: CachedSequence, label: str) -> None:
    num_cached = sequence.num_cached
    assert sequence.cache.get_seq_length() == num_cached, (
        f"{label}: the cache holds {sequence.cache.get_seq_length()} positions, num_cached says {num_cached}"
    )
    fresh = CachedSequence(sequence.model, sequence.token_ids[:num_cached])
    fresh.feed(1)  # one pass over exactly the kept tokens
    for index, (layer, fresh_layer) in enumerate(zip(sequence.cache.layers, fresh.cache.layers, strict=True)):
        for kind in ("keys", "values"):
            got, want = getattr(layer, kind), getattr(fresh_layer, kind)  # [1, kv_heads, positions, head_dim]
            assert got.shape == want.shape, f"{label} layer {index} {kind}: {tuple(got.shape)} != {tuple(want.shape)}"
            assert torch.allclose(got, want, atol=ATOL, rtol=0), (
                f"{label} layer {index} {kind}: max |diff| {float((got - want).abs().max()):.3g}; "
                "a rejected draft's keys/values survived the rollback"
            )


def speculate(
    target: LoadedModel, draft: LoadedModel, k: int, sampling: SamplingParams, max_tokens: int
) -> tuple[GenerationResult, DraftSession, TargetSession]:
    """What SpeculativeEngine.stream does, keeping hold of the sessions."""
    target_session = TargetWorker(target).open_session(PROMPT, sampling.seed)
    draft_session = DraftWorker(draft).open_session(PROMPT, sampling.seed)
    target_session.prefill()
    draft_session.prefill()
    result = SpeculativeDecoder(
        draft_session,
        target_session,
        num_prompt_tokens=len(PROMPT),
        k=k,
        sampling=sampling,
        stop=StopConditions(max_tokens, target.eos_token_ids),
        max_context=target.max_context,
    ).run()
    return result, draft_session, target_session


@pytest.mark.parametrize("k", [1, 3, 4, 8])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_k=20, seed=4)])
def test_caches_equal_a_fresh_prefill_after_rejections(
    tiny_target: LoadedModel, tiny_draft: LoadedModel, k: int, sampling: SamplingParams
) -> None:
    result, draft_session, target_session = speculate(tiny_target, tiny_draft, k, sampling, max_tokens=30)
    stats = result.stats
    assert result.finish_reason in ("length", "eos")
    assert 0 < stats.num_accepted < stats.num_proposed, f"needs some rejections to roll back: {stats}"
    assert any(a < p for a, p in zip(stats.accepted_at_position, stats.proposed_at_position, strict=True)), stats
    generated = PROMPT + result.token_ids

    target_sequence = target_session.sequence
    if result.finish_reason == "length":
        assert target_sequence.token_ids == generated, "the target holds prompt + output"
    else:  # an EOS mid-round: the target committed the whole verdict, past the EOS
        assert target_sequence.token_ids[: len(generated)] == generated
    assert target_sequence.num_pending == 1, "the target's last context token is always pending"
    assert_cache_matches_fresh_prefill(target_sequence, "target")

    draft_sequence = draft_session.sequence
    if result.finish_reason == "length":
        # committed after every round with k > 0; a last round squeezed to k = 0 leaves it one token behind
        assert draft_sequence.token_ids in (generated, generated[:-1]), "the draft's context is not the output"
    else:
        assert draft_sequence.token_ids == target_sequence.token_ids
    assert draft_sequence.num_cached < len(draft_sequence.token_ids)
    assert_cache_matches_fresh_prefill(draft_sequence, "draft")


def test_truncate_then_feed_equals_a_fresh_prefill(tiny_target: LoadedModel) -> None:
    sequence = CachedSequence(tiny_target.model, list(range(40, 52)))
    sequence.feed(1)
    sequence.truncate(7)  # drop five cached positions
    assert (sequence.num_cached, sequence.cache.get_seq_length()) == (7, 7)
    sequence.token_ids += [200, 201, 202]
    logits = sequence.feed(3)  # [3, vocab]
    fresh = CachedSequence(tiny_target.model, list(range(40, 47)) + [200, 201, 202])
    fresh_logits = fresh.feed(3)
    assert torch.allclose(logits, fresh_logits, atol=1e-4, rtol=0), float((logits - fresh_logits).abs().max())
    assert_cache_matches_fresh_prefill(sequence, "truncated")


def test_the_cache_check_detects_a_stale_position(tiny_target: LoadedModel) -> None:
    sequence = CachedSequence(tiny_target.model, list(range(40, 52)))
    sequence.feed(1)
    sequence.token_ids[5] = 7  # as if a rejected draft's keys/values were kept for position 5
    with pytest.raises(AssertionError, match="survived the rollback"):
        assert_cache_matches_fresh_prefill(sequence, "stale")
