"""Where a speculative output departs from target-only, was it a near-tie of the target's top two logits?

Scoring k + 1 positions in one pass may round differently from one position at a time (bfloat16,
batching, GPU kernels), so greedy outputs may legitimately part at a near-tie, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specserve.models.llama_cpp import LlamaCppModel, LlamaCppSequence
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence

NEAR_TIE_TOLERANCE: dict[torch.dtype, float] = {
    # 8 significant bits: one ulp at |logit| 16..32 is 0.125; 0.5 is a few ulps of rounding noise
    torch.bfloat16: 0.5,
    torch.float16: 0.1,  # 11 significant bits
    torch.float32: 1e-3,  # reduction-order noise is ~1e-5 at these magnitudes
}
LLAMA_CPP_TOLERANCE = 0.5  # llama.cpp: a float16 KV cache, and 8-bit activations for quantized weights


@dataclass(frozen=True, slots=True)
class Divergence:
    position: int  # index into the generated tokens of the first difference
    reference_token_id: int | None  # None where the reference ended
    candidate_token_id: int | None
    top2_margin: float  # top-1 minus top-2 target logit there
    reference_gap: float  # max logit minus the reference token's logit
    candidate_gap: float
    tolerance: float

    @property
    def near_tie(self) -> bool:
        return self.reference_gap <= self.tolerance and self.candidate_gap <= self.tolerance

    def to_dict(self) -> dict[str, object]:
        return {
            "position": self.position,
            "tokens": [self.reference_token_id, self.candidate_token_id],
            "top2_margin": round(self.top2_margin, 4),
            "near_tie": self.near_tie,
        }


def first_difference(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """The first index where the sequences differ or one ends; None if equal."""
    for i, (a, b) in enumerate(zip(reference, candidate)):
        if a != b:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


class ReferenceDecoder:
    """The target's logits after prompt + generated, computed as target-only decoding does: the prompt but
    its last token in one pass, then one token per pass. One cache per prompt is kept and cut back to the
    part a new prefix shares with the last one (the same passes, so the same numbers): checking many
    outputs of the same prompts costs about one decode per prompt, not one per output."""

    def __init__(self, target: LoadedModel) -> None:
        self.target = target
        self._sequences: dict[tuple[int, ...], CachedSequence | LlamaCppSequence] = {}

    @torch.inference_mode()
    def logits(self, prompt_token_ids: Sequence[int], generated: Sequence[int]) -> torch.Tensor:
        """float32 logits [vocab] after prompt + generated, over the tokenizer's ids (padding rows cut off)."""
        prompt = tuple(prompt_token_ids)
        tokens = [*prompt, *generated]
        sequence = self._sequences.get(prompt)
        if sequence is None:
            sequence = self._sequences[prompt] = self._new_sequence(list(prompt))
            if len(prompt) > 1:
                sequence.feed(1, upto=len(prompt) - 1)
        shared = len(prompt) - 1 + _common_length(sequence.token_ids[len(prompt) - 1 :], tokens[len(prompt) - 1 :])
        sequence.truncate(min(shared, len(tokens) - 1))  # the last token is fed again: its logits are the answer
        sequence.token_ids.extend(tokens[len(sequence.token_ids) :])
        for end in range(sequence.num_cached + 1, len(tokens) + 1):
            logits = sequence.feed(1, upto=end)  # [1, vocab]
        return logits[-1, : self.target.vocab_size].float()

    def _new_sequence(self, token_ids: list[int]) -> CachedSequence | LlamaCppSequence:
        """transformers' own forward pass for a torch model (the reference the lean pass is checked against)."""
        model = self.target.model
        if isinstance(model, LlamaCppModel):
            return LlamaCppSequence(model, token_ids)
        return CachedSequence(model, token_ids)


def reference_logits(target: LoadedModel, prompt_token_ids: Sequence[int], generated: Sequence[int]) -> torch.Tensor:
    """float32 logits [vocab] after prompt + generated, computed as target-only decoding does."""
    return ReferenceDecoder(target).logits(prompt_token_ids, generated)


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    difference = first_difference(a, b)
    return min(len(a), len(b)) if difference is None else difference


def near_tie_tolerance(target: LoadedModel) -> float:
    """How far below the maximum a logit may be and still count as tied: the engine's rounding noise."""
    if target.engine == "llama.cpp":
        return LLAMA_CPP_TOLERANCE
    return NEAR_TIE_TOLERANCE.get(target.dtype, 1e-3)


def first_divergence(
    target: LoadedModel | ReferenceDecoder,
    prompt_token_ids: Sequence[int],
    reference: Sequence[int],
    candidate: Sequence[int],
    tolerance: float | None = None,
) -> Divergence | None:
    """None when equal; else the target's view of the first differing position. Pass a ReferenceDecoder
    to check many outputs of the same prompts."""
    position = first_difference(reference, candidate)
    if position is None:
        return None
    reference_token = reference[position] if position < len(reference) else None
    candidate_token = candidate[position] if position < len(candidate) else None
    decoder = target if isinstance(target, ReferenceDecoder) else ReferenceDecoder(target)
    logits = decoder.logits(prompt_token_ids, reference[:position])
    top2 = logits.topk(2).values
    top = float(top2[0])

    def gap(token: int | None) -> float:  # a missing token (one output ended) is no tie at all
        return float("inf") if token is None else top - float(logits[token])

    return Divergence(
        position,
        reference_token,
        candidate_token,
        top - float(top2[1]),
        gap(reference_token),
        gap(candidate_token),
        near_tie_tolerance(decoder.target) if tolerance is None else tolerance,
    )
