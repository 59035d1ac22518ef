"""Where a speculative output departs from target-only, was it a near-tie of the target's top two logits?"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence

# The largest top-2 logit margin still called a near-tie: a few ulps of the dtype at |logit| ~ 20.
NEAR_TIE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.05}


@dataclass(frozen=True, slots=True)
class Divergence:
    position: int  # index into the generated tokens
    margin: float  # target's top-1 minus top-2 logit there, from a one-token-at-a-time pass
    near_tie: bool


def first_divergence(
    target: LoadedModel, prompt_token_ids: list[int], reference: list[int], other: list[int]
) -> Divergence | None:
    """None when `other` equals `reference` over their common length."""
    position = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if position is None:
        return None
    sequence = CachedSequence(target.model, prompt_token_ids + reference[:position])
    num_prompt = len(prompt_token_ids)
    if num_prompt > 1:  # the same passes as target-only decoding: prefill, then one token per pass
        sequence.feed(1, upto=num_prompt - 1)
    for end in range(num_prompt, len(sequence.token_ids) + 1):
        logits = sequence.feed(1, upto=end)  # [1, vocab]
    top2 = logits[-1].float().topk(2).values
    margin = float(top2[0] - top2[1])
    return Divergence(position, margin, margin <= NEAR_TIE.get(target.dtype, 1e-3))
