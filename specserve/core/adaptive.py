"""Adaptive speculation length: per round, the k that maximises a session's expected tokens per second,
from its observed acceptance, the measured cost of a draft step, and the measured cost of a target pass
at the current batch size. k = 0 (target-only) whenever no k > 0 is expected to beat it.

With per-token acceptance a, a window of k drafts yields E(k) = (1 - a^(k+1)) / (1 - a) tokens (the
recovered/bonus token included). A round costs k draft steps plus one target pass over the batch, whose
cost grows with the tokens in it: B sessions verifying k + 1 tokens each put B(k + 1) tokens in the pass.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.9  # weight of the past per observation: recent rounds dominate after ~10


@dataclass(slots=True)
class PassCost:
    """Seconds of one forward pass as a linear function of the tokens in it, fitted online
    (exponentially weighted least squares) from (tokens, seconds) pairs the workers report."""

    n: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        self.n = DECAY * self.n + 1
        self.sum_x = DECAY * self.sum_x + num_tokens
        self.sum_y = DECAY * self.sum_y + seconds
        self.sum_xx = DECAY * self.sum_xx + num_tokens * num_tokens
        self.sum_xy = DECAY * self.sum_xy + num_tokens * seconds

    def seconds(self, num_tokens: int) -> float | None:
        """Predicted seconds for a pass over `num_tokens`; None before any observation."""
        if self.n == 0:
            return None
        mean_x, mean_y = self.sum_x / self.n, self.sum_y / self.n
        var_x = self.sum_xx / self.n - mean_x * mean_x
        slope = 0.0 if var_x < 1e-9 else max(0.0, (self.sum_xy / self.n - mean_x * mean_y) / var_x)
        return max(1e-6, mean_y + slope * (num_tokens - mean_x))


@dataclass(slots=True)
class AdaptiveK:
    """One session's speculation length."""

    max_k: int
    initial_k: int = 4
    """k until the first costs are measured."""
    prior_acceptance: float = 0.7
    prior_weight: float = 2.0
    probe_every: int = 8
    """Rounds at k = 0 between probes at k = 1, so acceptance keeps being measured."""
    num_accepted: float = 0.0
    num_rejected: float = 0.0
    draft_step_s: float | None = None
    _rounds_off: int = 0

    @property
    def acceptance(self) -> float:
        """Per-token acceptance estimate: accepted / (accepted + rejections), with a prior."""
        accepted = self.num_accepted + self.prior_weight * self.prior_acceptance
        return accepted / (self.num_accepted + self.num_rejected + self.prior_weight)

    def observe(self, k: int, num_accepted: int, draft_s: float) -> None:
        """One round: k drafts, num_accepted of them accepted, draft_s the time the round waited for them
        (near 0 when a pre-drafted window was ready: overlap makes drafting cheaper, and k follows)."""
        if k == 0:
            return
        self.num_accepted = DECAY * self.num_accepted + num_accepted
        self.num_rejected = DECAY * self.num_rejected + (1 if num_accepted < k else 0)
        step_s = draft_s / k
        self.draft_step_s = step_s if self.draft_step_s is None else DECAY * self.draft_step_s + (1 - DECAY) * step_s

    def choose(self, verify: PassCost, batch_size: int) -> int:
        """The k with the best expected tokens per second at this batch size (0 if none beats target-only)."""
        target_only = verify.seconds(batch_size)
        if target_only is None or self.draft_step_s is None:
            return min(self.initial_k, self.max_k)  # nothing measured yet: speculate, and measure
        best_k, best_rate = 0, 1.0 / target_only
        for k in range(1, self.max_k + 1):
            pass_s = verify.seconds(batch_size * (k + 1))
            assert pass_s is not None
            rate = expected_tokens(self.acceptance, k) / (k * self.draft_step_s + pass_s)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self._rounds_off += 1
            if self._rounds_off % self.probe_every == 0:
                return 1
        else:
            self._rounds_off = 0
        return best_k


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round emits on average: accepted drafts plus the recovered/bonus token."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass(slots=True)
class SharedAdaptiveK:
    """One k for all sessions on a target replica, decided again at most every `period_s` seconds.

    Sessions with different k reach the target at different moments (a k = 0 session skips the draft),
    so they stop sharing its passes; one k per replica keeps them in step. Acceptance and draft cost are
    pooled over the replica's sessions.
    """

    policy: AdaptiveK
    period_s: float = 1.0
    _k: int = 0
    _decided_at: float | None = None

    def choose(self, verify: PassCost, batch_size: int, now: float) -> int:
        if self._decided_at is None or now - self._decided_at >= self.period_s:
            self._k, self._decided_at = self.policy.choose(verify, batch_size), now
        return self._k
