"""Measured costs: a session's round seconds per (batch bucket, k), the verify call per window length, the
draft per step, and what leaving target-only costs (the drafts catching up). Measured online, because the
cost of a window's length differs by engine: about one step for k + 1 tokens on a GPU, several on a CPU."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

STALL_CLIP = 2.0  # a sample counts at most this many times the mean: rounds held by a stall left out of
# `stalled_s` (a prefill elsewhere, the host) would otherwise swing a figure of a few rounds by 20%
STALL_MEMORY = 4.0  # stall figures keep this many cost half-lives: a prefill comes every few seconds at most
STALL_TOKENS = 64.0  # emitted tokens a bucket's stall figure needs before it is used


def batch_bucket(batch_size: int) -> int:
    """Octave buckets (1, 2, 3-5, 6-11, 12-22, ...): nearby batch sizes cost about the same, and a batch
    one session short now and then (a session between requests) stays in its bucket."""
    return round(math.log2(max(1, batch_size)))


@dataclass(slots=True)
class DecayedMean:
    """Mean and variance of samples that lose half their weight every `half_life_s` seconds; `weight` is
    the effective number of samples, which falls while nothing is observed (a stale figure is uncertain)."""

    half_life_s: float
    clipped: bool = True
    """Clip a sample at STALL_CLIP times the mean (off for figures made of rare large samples, as stalls)."""
    total: float = 0.0
    squares: float = 0.0
    weight_then: float = 0.0
    updated_at: float = -math.inf

    def observe(self, value: float, now: float, weight: float = 1.0) -> None:
        # a stall the caller could not see (see STALL_CLIP) moves the mean less
        if self.clipped and self.weight(now) >= 2.0:
            value = min(value, STALL_CLIP * self.total / self.weight_then)
        kept = self._kept(now)
        self.total = kept * self.total + weight * value
        self.squares = kept * self.squares + weight * value * value
        self.weight_then = kept * self.weight_then + weight
        self.updated_at = max(self.updated_at, now)

    def _kept(self, now: float) -> float:
        if self.weight_then <= 0.0:
            return 0.0
        return 0.5 ** (max(0.0, now - self.updated_at) / self.half_life_s)

    def weight(self, now: float) -> float:
        return self.weight_then * self._kept(now)

    @property
    def mean(self) -> float | None:
        return self.total / self.weight_then if self.weight_then > 0.0 else None

    def relative_error(self, now: float) -> float:
        """Standard error of the mean over the mean (infinite below two samples' weight)."""
        mean, weight = self.mean, self.weight(now)
        if mean is None or mean <= 0.0 or weight < 2.0:
            return math.inf
        variance = max(0.0, self.squares / self.weight_then - mean * mean)
        return math.sqrt(variance / weight) / mean


@dataclass(slots=True)
class BucketCosts:
    """What rounds cost at one batch bucket."""

    half_life_s: float
    round_s: dict[int, DecayedMean] = field(default_factory=dict)
    """k: a session's round, from the end of its previous one (waits, overlap and batching included)."""
    verify_s: dict[int, DecayedMean] = field(default_factory=dict)
    """window length (drafts + 1): the verify call."""
    draft_step_s: DecayedMean | None = None
    """The propose call per draft token (near 0 for lookup drafts and pre-drafted windows)."""

    def mean(self, table: dict[int, DecayedMean], key: int) -> DecayedMean:
        return table.setdefault(key, DecayedMean(self.half_life_s))

    def verify_seconds(self, length: int) -> float | None:
        """Measured at `length`, else linear in the window length through the nearest measured lengths on
        either side (or the two nearest on one side, the slope at least 0); None below two lengths."""
        measured = {n: m.mean for n, m in self.verify_s.items() if m.mean is not None}
        if length in measured:
            return measured[length]
        below = sorted(n for n in measured if n < length)
        above = sorted(n for n in measured if n > length)
        pair = [below[-1], above[0]] if below and above else below[-2:] if below else above[:2]
        if len(pair) < 2:
            return None
        (n0, n1), (s0, s1) = pair, (measured[pair[0]], measured[pair[1]])
        slope = max(0.0, (s1 - s0) / (n1 - n0))
        return max(0.0, s0 + slope * (length - n0))

    def modelled_round_s(self, k: int) -> float | None:
        """k draft steps plus the verify of k + 1 tokens, scaled by how the measured round nearest in k
        compares with the same sum there (overlap, waits and the host's other costs). Without the calls'
        times, linear in k between the measured rounds on either side; else None."""
        modelled = self._sum(k)
        if modelled is None:
            return self._between(k)
        for other in sorted(self.round_s, key=lambda x: abs(x - k)):
            there, sum_there = self.round_s[other].mean, self._sum(other)
            if there is not None and sum_there:
                return modelled * there / sum_there
        return modelled

    def _between(self, k: int) -> float | None:
        measured = {x: m.mean for x, m in self.round_s.items() if m.mean is not None}
        below, above = [x for x in measured if x < k], [x for x in measured if x > k]
        if not below or not above:
            return None
        k0, k1 = max(below), min(above)
        s0, s1 = measured[k0], measured[k1]
        return s0 + (s1 - s0) * (k - k0) / (k1 - k0)

    def _sum(self, k: int) -> float | None:
        verify = self.verify_seconds(k + 1)
        step = self.draft_step_s.mean if self.draft_step_s is not None else None
        if verify is None or (k > 0 and step is None):
            return None
        return k * (step or 0.0) + verify


@dataclass(slots=True)
class CostModel:
    """Round, verify and draft costs per batch bucket, and the drafts' catch-up when leaving k = 0."""

    half_life_s: float = 30.0
    buckets: dict[int, BucketCosts] = field(default_factory=dict)
    draft_prefill_s: DecayedMean | None = None
    """A draft prefill's seconds per context token (what a draft catching up costs)."""
    draft_lag: float | None = None
    """Context tokens a session's draft lacks at k = 0, averaged over the recent rounds (None: none seen)."""
    stall_s: dict[int, DecayedMean] = field(default_factory=dict)
    """bucket: seconds other sessions' prefills held a session, per token it emitted (pooled over every k)."""
    target_prefill_s: dict[bool, DecayedMean] = field(default_factory=dict)
    """with a draft's prefill beside it: a target prefill's seconds per prompt token (prefills run alone)."""
    beside_draft: DecayedMean | None = None
    """The share of target prefills with a draft's beside them."""

    def bucket(self, batch_size: int) -> BucketCosts:
        key = batch_bucket(batch_size)
        return self.buckets.setdefault(key, BucketCosts(self.half_life_s))

    def observe_round(self, batch_size: int, k: int, seconds: float, now: float) -> None:
        """A session's round. The sessions of a batch share their passes, so their rounds' times move
        together: each counts 1 / batch_size, and a figure's weight is in batch rounds."""
        costs = self.bucket(batch_size)
        costs.mean(costs.round_s, k).observe(seconds, now, weight=1.0 / max(1, batch_size))

    def observe_calls(
        self, batch_size: int, num_drafted: int, draft_s: float | None, verify_s: float | None, now: float
    ) -> None:
        """The round's propose and verify calls; a window of `num_drafted` drafts is verified as
        num_drafted + 1 tokens."""
        costs = self.bucket(batch_size)
        if verify_s is not None:
            costs.mean(costs.verify_s, num_drafted + 1).observe(verify_s, now)
        if draft_s is not None and num_drafted > 0:
            if costs.draft_step_s is None:
                costs.draft_step_s = DecayedMean(self.half_life_s)
            costs.draft_step_s.observe(draft_s / num_drafted, now, weight=num_drafted)

    def observe_draft_prefill(self, seconds: float, num_tokens: int, now: float) -> None:
        if num_tokens > 0:
            if self.draft_prefill_s is None:
                self.draft_prefill_s = DecayedMean(self.half_life_s * 10)  # prefills are rare: minutes count
            self.draft_prefill_s.observe(seconds / num_tokens, now, weight=num_tokens)

    def observe_lag(self, num_tokens: int) -> None:
        if self.draft_lag is None:  # the first round sets it: rising from 0 it would price catch-ups at nothing
            self.draft_lag = float(num_tokens)
        self.draft_lag += 0.1 * (num_tokens - self.draft_lag)  # about the last ten rounds at k = 0

    def observe_stall(self, batch_size: int, stalled_s: float, num_tokens: int, now: float) -> None:
        """A session's round emitted `num_tokens` and stood `stalled_s` beside other sessions' prefills."""
        memory = self.half_life_s * STALL_MEMORY
        stall = self.stall_s.setdefault(batch_bucket(batch_size), DecayedMean(memory, clipped=False))
        stall.observe(max(0.0, stalled_s) / max(1, num_tokens), now, weight=max(1, num_tokens))

    def observe_target_prefill(
        self, seconds: float, num_tokens: int, beside_draft: bool, alone: bool, now: float
    ) -> None:
        """A new request's target prefill of `num_tokens`; `alone`: no other prefill overlapped it."""
        memory = self.half_life_s * STALL_MEMORY
        if self.beside_draft is None:
            self.beside_draft = DecayedMean(memory, clipped=False)
        self.beside_draft.observe(float(beside_draft), now)
        if alone and num_tokens > 0:
            per_token = self.target_prefill_s.setdefault(beside_draft, DecayedMean(memory, clipped=False))
            per_token.observe(seconds / num_tokens, now, weight=num_tokens)

    def stall_per_token(self, batch_size: int, speculating: bool, now: float) -> float:
        """Seconds of other sessions' prefills a session waits per token it emits: the pooled figure of the
        nearest bucket that has one, scaled to prefills with (k > 0) or without (k = 0) a draft's beside.
        At k > 0 a new request's draft prefills beside its target on shared cores and slows it; leaving
        stalls out of the rounds would credit speculation with that."""
        key = batch_bucket(batch_size)
        trusted = {b: m.mean for b, m in self.stall_s.items() if m.mean is not None and m.weight(now) >= STALL_TOKENS}
        nearest = min(trusted, key=lambda b: abs(b - key), default=None)
        return 0.0 if nearest is None else (trusted[nearest] or 0.0) * self._prefill_weight(speculating)

    def _prefill_weight(self, speculating: bool) -> float:
        """A target prefill's seconds with (or without) a draft's beside over those of the mix the pooled stall
        was measured under; 1 until both kinds were timed."""
        with_draft, alone = (self.target_prefill_s.get(flag) for flag in (True, False))
        if with_draft is None or alone is None or self.beside_draft is None:
            return 1.0
        share, a, b = self.beside_draft.mean, with_draft.mean, alone.mean
        if share is None or a is None or b is None:
            return 1.0
        mixed = share * a + (1.0 - share) * b
        return (a if speculating else b) / mixed if mixed > 0.0 else 1.0

    def catch_up_s(self, batch_size: int) -> float:
        """Seconds each session stands still when k leaves 0: every draft of the batch prefills what it
        lacks, one after another on a shared draft; 0 until a draft prefill was measured."""
        per_token = self.draft_prefill_s.mean if self.draft_prefill_s is not None else None
        return (per_token or 0.0) * (self.draft_lag or 0.0) * batch_size
