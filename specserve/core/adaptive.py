"""Adaptive speculation length from measured round times: per target replica, the k with the most expected
tokens per second per session at about the current batch size, re-measuring the nearby choices (k - 1,
k + 1 and target-only, k = 0) now and then, so that k follows load and acceptance.

A round at k emits E(k) = sum over j = 0..k of a_0 a_1 ... a_(j-1) tokens on average (the recovered/bonus
token included), a_i being the acceptance of the draft at window position i given that those before it
were accepted. Per position, because acceptance comes in runs (in code, a window whose first drafts are
right tends to be right to the end): one per-token rate would undervalue deep windows. The a_i are pooled
over all rounds, so they settle fast. A round's seconds are measured per (batch size, k), not modelled: a
cost model has to guess how draft and target share the hardware (two processes on the same cores,
pre-drafting overlapped with verification, batching waits), and its errors made speculation look too dear
at 8 clients here (0.96x target-only where k = 4 gave 1.10x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DECAY = 0.9  # round times: weight of the past per observation, about the last ten rounds count
ACCEPTANCE_DECAY = 0.98  # acceptance: about the last fifty rounds count


@dataclass(slots=True)
class RoundTime:
    """Exponentially weighted mean of a session's round seconds at one (batch size, k)."""

    seconds: float = 0.0
    weight: float = 0.0
    updated_at: float = -math.inf

    def observe(self, seconds: float, now: float) -> None:
        self.weight = DECAY * self.weight + 1.0
        self.seconds += (seconds - self.seconds) / self.weight
        self.updated_at = now


def batch_bucket(batch_size: int) -> int:
    """Half-octave buckets (1, 2, 3, 4, 5-6, 7-9, 10-13, 14-19, ...): nearby batch sizes cost about the same."""
    return round(2 * math.log2(max(1, batch_size)))


@dataclass(slots=True)
class AdaptiveK:
    """One k for all sessions of a target replica, decided at most every `period_s` seconds.

    One k per replica, not per session: sessions with different k reach the target at different moments
    (a k = 0 session skips the draft) and stop sharing its batched passes.
    """

    max_k: int
    initial_k: int = 4
    """k until rounds have been measured."""
    period_s: float = 1.0
    """Decisions come at most this often (and after a change, only once two rounds ran at the new k)."""
    refresh_s: float = 15.0
    """A neighbouring choice is measured again when its figure is older than this (four times longer when
    it was more than a quarter slower: exploring a bad choice costs more)."""
    explore_every: int = 4
    """At most one decision in this many measures a neighbour; the others take the best k."""
    min_weight: float = 1.5
    """Rounds (decayed) before a round time is trusted: two."""
    prior_acceptance: float = 0.7
    prior_weight: float = 2.0
    times: dict[tuple[int, int], RoundTime] = field(default_factory=dict)
    accepted_at: list[float] = field(default_factory=list)
    """[i]: drafts at window position i accepted (decayed), among examined_at[i] the target examined."""
    examined_at: list[float] = field(default_factory=list)
    _k: int = 0
    _decided_at: float = -math.inf
    _since_explored: int = 0
    _last_round_s: float = 0.0
    _settled_at: float = -math.inf

    def acceptance(self, position: int) -> float:
        """a_i: acceptance at window position i given the drafts before it were accepted, with a prior;
        positions never examined take the deepest one measured."""
        i = min(position, len(self.examined_at) - 1)
        accepted = (self.accepted_at[i] if i >= 0 else 0.0) + self.prior_weight * self.prior_acceptance
        return accepted / ((self.examined_at[i] if i >= 0 else 0.0) + self.prior_weight)

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a round at k emits on average, the recovered/bonus token included."""
        tokens, reach = 1.0, 1.0
        for i in range(k):
            reach *= self.acceptance(i)
            tokens += reach
        return tokens

    def observe(self, batch_size: int, k: int, num_accepted: int, seconds: float, now: float) -> None:
        """One session's round: `k` drafts, `num_accepted` of them accepted, `seconds` since its previous
        round ended (waits and overlap included)."""
        if k > 0:
            grow = k - len(self.examined_at)
            self.examined_at.extend([0.0] * grow)
            self.accepted_at.extend([0.0] * grow)
            for i in range(len(self.examined_at)):
                self.examined_at[i] *= ACCEPTANCE_DECAY
                self.accepted_at[i] *= ACCEPTANCE_DECAY
            for i in range(min(num_accepted + 1, k)):  # examined up to the first rejection
                self.examined_at[i] += 1.0
                self.accepted_at[i] += i < num_accepted
        self._last_round_s = seconds
        if now - seconds < self._settled_at:
            # Started while other sessions still ran the previous k: in one batched pass their tokens set
            # the cost, so a deeper window would look nearly free (measured: k climbing to 8 at 16 clients).
            return
        key = (batch_bucket(batch_size), min(k, self.max_k))
        self.times.setdefault(key, RoundTime()).observe(seconds, now)

    def choose(self, batch_size: int, now: float) -> int:
        # a new k stands until the rounds in flight at the change have ended and two more were measured
        if now - self._decided_at >= self.period_s and now >= self._settled_at + 2 * self._last_round_s:
            k = self._decide(batch_bucket(batch_size), now)
            if k != self._k:
                self._settled_at = now + self._last_round_s
            self._k, self._decided_at = k, now
        return self._k

    def estimate(self, bucket: int, k: int) -> float | None:
        """Expected tokens per second per session at (bucket, k), from its round time, else the nearest
        bucket's; None when k has not been measured."""
        measured = [
            (abs(b - bucket), round_time.seconds)
            for (b, kk), round_time in self.times.items()
            if kk == k and round_time.weight >= self.min_weight
        ]
        return self.expected_tokens(k) / max(min(measured)[1], 1e-9) if measured else None

    def _decide(self, bucket: int, now: float) -> int:
        estimates = {k: self.estimate(bucket, k) for k in range(self.max_k + 1)}
        known = {k: rate for k, rate in estimates.items() if rate is not None}
        if not known:
            return min(self.initial_k, self.max_k)
        best = max(known, key=lambda k: known[k])
        self._since_explored += 1
        if self._since_explored < self.explore_every:
            return best
        neighbours = {k for k in (best - 1, best + 1, 0) if 0 <= k <= self.max_k and k != best}
        due = [k for k in neighbours if self._due(bucket, k, known[best], estimates[k], now)]
        if not due:
            return best
        self._since_explored = 0
        return min(due, key=lambda k: self._updated_at(bucket, k))

    def _due(self, bucket: int, k: int, best_rate: float, estimate: float | None, now: float) -> bool:
        round_time = self.times.get((bucket, k))
        if round_time is None or round_time.weight < self.min_weight:
            return True
        slower = estimate is not None and estimate < 0.75 * best_rate
        return now - round_time.updated_at > self.refresh_s * (4 if slower else 1)

    def _updated_at(self, bucket: int, k: int) -> float:
        round_time = self.times.get((bucket, k))
        return round_time.updated_at if round_time is not None else -math.inf


