"""Value types and the two protocols the speculative loop runs over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # imported where used: a client builds SamplingParams without loading torch
    import torch

MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4  # beyond them float32 logits overflow (x / t) or t itself does


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    """0: greedy (argmax); else the softmax temperature the tokens are sampled at."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the likeliest tokens whose probabilities add up to this (1: off)."""
    top_k: int = 0
    """Sample from the k likeliest tokens (0: off)."""
    seed: int | None = None
    """A seeded sample reproduces its output; None: fresh randomness."""

    def __post_init__(self) -> None:
        if not (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            low, high = MIN_TEMPERATURE, MAX_TEMPERATURE
            raise ValueError(f"temperature must be >= 0: 0 (greedy) or in [{low}, {high}], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class SparseProbs:
    """Distributions over the vocabulary given by their support: row i puts probs[i][j] on token_ids[i][j]
    and nothing elsewhere. A draft samples from a few dozen tokens, not the whole vocabulary."""

    token_ids: tuple[torch.Tensor, ...]  # per row [m_i] int64
    probs: tuple[torch.Tensor, ...]  # per row [m_i] float32

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, rows: slice) -> SparseProbs:
        return SparseProbs(self.token_ids[rows], self.probs[rows])

    def to_dense(self, vocab_size: int) -> torch.Tensor:
        """-> [rows, vocab_size] float32."""
        import torch

        dense = torch.zeros(len(self), vocab_size, dtype=torch.float32)
        for row, token_ids, probs in zip(dense, self.token_ids, self.probs):
            row[token_ids] = probs
        return dense


@dataclass(frozen=True, slots=True)
class Proposal:
    """What the draft proposes for one round."""

    token_ids: list[int]  # k proposed tokens
    probs: SparseProbs | None = None  # k rows: the draft distribution they were sampled from; None if greedy
    source: str = ""  # which drafter made it: "model", "ngram" (prompt lookup); "" when not said


@dataclass(frozen=True, slots=True)
class Verdict:
    """The target's decision on one proposal."""

    token_ids: list[int]  # accepted drafts + exactly one recovered-or-bonus token; len >= 1
    num_accepted: int  # 0..k, excludes the recovered/bonus token


class Drafter(Protocol):
    """Proposes tokens continuing its context. Context = prompt + everything committed since."""

    def propose(self, k: int, sampling: SamplingParams) -> Proposal: ...

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        """Keep the first `num_kept` context tokens (drops rejected proposals), then append these."""
        ...


class Verifier(Protocol):
    """Scores the last context token plus k proposals in one pass and decides what to keep.

    The verifier's own context advances by the verdict's tokens: it commits as it decides.
    """

    def verify(self, proposal: Proposal, sampling: SamplingParams) -> Verdict: ...
