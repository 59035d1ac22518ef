"""Shared test helpers: total-variation bounds, deliberately biased samplers, the near-tie check.

Imports only torch and specserve.core at load time, so the pure-core unit tests can use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from specserve.core.types import Verdict

if TYPE_CHECKING:
    from specserve.models.loading import LoadedModel

K = TypeVar("K")

# ---------------------------------------------------------------------------------------------------
# Total variation


def tv_distance(empirical: Mapping[K, float], reference: Mapping[K, float]) -> float:
    """0.5 * sum |empirical - reference| over the union of both supports."""
    keys = set(empirical) | set(reference)
    return 0.5 * sum(abs(empirical.get(x, 0.0) - reference.get(x, 0.0)) for x in keys)


def normalize(counts: Mapping[K, float]) -> dict[K, float]:
    total = sum(counts.values())
    assert total > 0, "no samples"
    return {x: c / total for x, c in counts.items()}


def tv_bound(
    reference: Mapping[K, float] | Sequence[float] | torch.Tensor, num_samples: int, delta: float = 1e-6
) -> float:
    """An upper bound the TV of `num_samples` i.i.d. draws from `reference` exceeds with probability <= delta.

    E[TV] <= 0.5 * sum_i sqrt(p_i (1 - p_i) / n) (Jensen on each |p^_i - p_i|), and TV changes by at most
    1/n when one sample changes, so McDiarmid adds sqrt(ln(1/delta) / (2n)). Seeded tests are deterministic
    anyway; the bound says how far from the target an honest sampler can plausibly land.
    """
    if isinstance(reference, Mapping):
        probs = [float(v) for v in reference.values()]
    elif isinstance(reference, torch.Tensor):
        probs = reference.double().flatten().tolist()
    else:
        probs = [float(v) for v in reference]
    assert num_samples > 0
    mean_bound = 0.5 * sum(math.sqrt(p * (1 - p) / num_samples) for p in probs if p > 0)
    return mean_bound + math.sqrt(math.log(1 / delta) / (2 * num_samples))


# ---------------------------------------------------------------------------------------------------
# Deliberately biased replacements for rejection_sample: the statistical tests must reject them


def always_accept(
    draft_token_ids: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Biased: emits the draft's distribution."""
    k = len(draft_token_ids)
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return Verdict(list(draft_token_ids) + [bonus], k)


def resample_target_on_rejection(
    draft_token_ids: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Biased: the right acceptance test, but a rejection resamples p instead of norm(max(0, p - q))."""
    k = len(draft_token_ids)
    for i, token_id in enumerate(draft_token_ids):
        ratio = float(target_probs[i, token_id] / draft_probs[i, token_id])
        if float(torch.rand(1, generator=generator)) >= ratio:
            recovered = int(torch.multinomial(target_probs[i], 1, generator=generator))
            return Verdict(list(draft_token_ids[:i]) + [recovered], i)
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return Verdict(list(draft_token_ids) + [bonus], k)


# ---------------------------------------------------------------------------------------------------
# Near ties: where speculative and target-only output may legitimately differ (bf16, batched, GPU)

NEAR_TIE_TOLERANCE: dict[torch.dtype, float] = {
    # bf16 has 8 significant bits: one ulp at |logit| ~ 16..32 is 0.125, so 0.5 is a few ulps of the
    # rounding noise a different matmul blocking (k + 1 rows vs 1 row) can introduce.
    torch.bfloat16: 0.5,
    # fp16 has 11 significant bits: 8x finer than bf16.
    torch.float16: 0.1,
    # fp32: 24 significant bits; reduction-order noise is ~1e-5 at these magnitudes.
    torch.float32: 1e-3,
}


@dataclass(frozen=True, slots=True)
class Divergence:
    position: int  # index into the generated tokens of the first difference
    reference_token_id: int | None  # None when the reference ended there
    candidate_token_id: int | None
    top2_margin: float  # top-1 minus top-2 reference logit at that position
    reference_gap: float  # max logit minus the reference token's logit
    candidate_gap: float
    tolerance: float


def first_divergence(reference_ids: Sequence[int], candidate_ids: Sequence[int]) -> int | None:
    """The first index where the two sequences differ (or one ends before the other); None if equal."""
    for i, (a, b) in enumerate(zip(reference_ids, candidate_ids, strict=False)):
        if a != b:
            return i
    if len(reference_ids) != len(candidate_ids):
        return min(len(reference_ids), len(candidate_ids))
    return None


@torch.inference_mode()
def reference_logits(
    target: LoadedModel, prompt_token_ids: Sequence[int], generated_token_ids: Sequence[int]
) -> torch.Tensor:
    """The target's float32 logits [vocab] for the token after prompt + generated.

    Prompt in one pass (as every run does), then the generated tokens one at a time: target-only
    decoding's arithmetic, independent of any speculative batching.
    """
    from specserve.models.sequence import CachedSequence

    num_prompt = len(prompt_token_ids)
    sequence = CachedSequence(target.model, list(prompt_token_ids) + list(generated_token_ids))
    logits = sequence.feed(1, upto=num_prompt)[-1]
    for end in range(num_prompt + 1, len(sequence.token_ids) + 1):
        logits = sequence.feed(1, upto=end)[-1]
    return logits.float()


def assert_divergence_is_near_tie(
    target: LoadedModel,
    prompt_token_ids: Sequence[int],
    reference_ids: Sequence[int],
    candidate_ids: Sequence[int],
    tolerance: float | None = None,
) -> Divergence | None:
    """None when the outputs are identical; else check the first divergence is a near-tie of the target.

    Both tokens chosen at the first differing position must have logits within `tolerance` of the
    target's maximum there (recomputed by `reference_logits`), so their top-2 margin is below it too.
    Later positions are not compared: after a divergence the contexts differ. Default tolerance by
    the target's dtype (NEAR_TIE_TOLERANCE). Raises AssertionError on a real disagreement.
    """
    position = first_divergence(reference_ids, candidate_ids)
    if position is None:
        return None
    if tolerance is None:
        tolerance = NEAR_TIE_TOLERANCE[target.dtype]
    reference_token = reference_ids[position] if position < len(reference_ids) else None
    candidate_token = candidate_ids[position] if position < len(candidate_ids) else None
    assert reference_token is not None and candidate_token is not None, (
        f"one output is a strict prefix of the other (lengths {len(reference_ids)} and {len(candidate_ids)}) "
        "with no differing token: that is a stopping bug, not a near-tie"
    )
    logits = reference_logits(target, prompt_token_ids, reference_ids[:position])
    top2 = logits.topk(2)
    top2_margin = float(top2.values[0] - top2.values[1])
    reference_gap = float(top2.values[0] - logits[reference_token])
    candidate_gap = float(top2.values[0] - logits[candidate_token])
    divergence = Divergence(
        position, reference_token, candidate_token, top2_margin, reference_gap, candidate_gap, tolerance
    )
    assert reference_gap <= tolerance and candidate_gap <= tolerance, (
        f"real disagreement at generated position {position}: reference token {reference_token} "
        f"(gap to the max logit {reference_gap:.4g}) vs candidate token {candidate_token} "
        f"(gap {candidate_gap:.4g}); top-2 margin {top2_margin:.4g}, top-2 ids {top2.indices.tolist()}, "
        f"tolerance {tolerance} for {target.dtype}"
    )
    return divergence
