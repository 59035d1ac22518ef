"""The adaptive-k decision: per target replica, the k (0 = target-only) with the most expected committed
tokens per second per session at the current batch size, E(k) / round_seconds(k), learned as a bandit over
k per batch bucket: measured rounds exploited, others explored optimistically when the switch would pay."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from specserve.adaptive.acceptance import AcceptanceModel
from specserve.adaptive.config import AdaptiveConfig
from specserve.adaptive.cost import CostModel, batch_bucket

logger = logging.getLogger(__name__)

IDLE_GAP_S = 5.0  # a longer gap between decisions is idle time, not serving time
MAX_STALLED_SHARE = 0.5  # a round stalled longer than this share of it is not timed: what is left of it is
# the difference of two near-equal clocks, and a near-zero round is a near-infinite rate


@dataclass(frozen=True, slots=True)
class Estimate:
    """Tokens per second per session at one k, and how sure: `rounds` measured (0: modelled or guessed)."""

    rate: float
    rounds: float
    relative_error: float = math.inf
    modelled: bool = False
    """From the calls' costs, not from rounds at this k."""


class AdaptivePolicy:
    """One k for all sessions of a target replica: sessions at different k reach the target at different
    moments and stop sharing its batched passes. Only k changes, never how a window is verified, so every
    choice is lossless. `choose` before each round, `observe` after it."""

    def __init__(self, config: AdaptiveConfig | None = None) -> None:
        self.config = config or AdaptiveConfig()
        c = self.config
        self.acceptance = AcceptanceModel(c.prior_acceptance, c.prior_weight, c.acceptance_decay)
        self.costs = CostModel(c.cost_half_life_s)
        self._k = self._chosen = c.initial_k
        self._decided_at = self._seen_at = -math.inf
        self._measured_from = -math.inf  # rounds that started earlier straddle the last change of k
        self._last_round_s = 0.0
        self._fresh_rounds = 0.0  # batch rounds measured at the current k since it was set
        self._explored_at: float | None = None  # while exploring: when its regret was last charged
        self._serving_s = self._lost_s = 0.0

    @property
    def k(self) -> int:
        """The k chosen last: what sessions draft now (and what a pre-draft drafts)."""
        return self._k

    @property
    def max_k(self) -> int:
        return self.config.max_k

    def observe(
        self,
        batch_size: int,
        k: int,
        num_accepted: int,
        seconds: float,
        now: float,
        *,
        num_asked: int | None = None,
        num_drafted: int | None = None,
        stalled_s: float = 0.0,
        draft_s: float | None = None,
        verify_s: float | None = None,
        draft_lag: int = 0,
    ) -> None:
        """A session's round at the policy's `k`: a window of `num_asked` drafts asked for (fewer than k near
        the token budget), `num_drafted` given (fewer when the draft stopped early), `num_accepted` accepted,
        `seconds` since its previous round ended, `stalled_s` of them beside another session's prefill (left
        out of the round and priced per emitted token instead: see CostModel.stall_per_token).
        `draft_s` / `verify_s`: the propose and verify calls; `draft_lag`: context tokens the draft lacks."""
        asked = k if num_asked is None else min(num_asked, k)
        drafted = asked if num_drafted is None else min(num_drafted, asked)
        if k == 0:
            self.costs.observe_lag(draft_lag)
        elif asked > 0:
            self.acceptance.observe(num_accepted, drafted, stopped_early=drafted < asked)
        # in a batch a session's verify call lasts what the deepest window (the policy's k) costs, not its own
        window = drafted if batch_size == 1 else min(k, self.max_k)
        self.costs.observe_calls(batch_size, window, draft_s, verify_s, now)
        self.costs.observe_stall(batch_size, stalled_s, num_accepted + 1, now)
        self._last_round_s = seconds
        if now - seconds < self._measured_from:
            return  # other sessions still ran the previous k (their windows set the pass's cost)
        if stalled_s > MAX_STALLED_SHARE * seconds:
            return  # mostly another session's prefill: what is left is too little to time the round by
        # counted under the policy's k whatever the window: in a batched pass the deepest window sets the cost
        self.costs.observe_round(batch_size, min(k, self.max_k), seconds - max(stalled_s, 0.0), now)
        if k == self._k:
            self._fresh_rounds += 1.0 / max(1, batch_size)

    def observe_draft_prefill(self, seconds: float, num_tokens: int, now: float) -> None:
        """A draft prefilled `num_tokens` of a session's context in `seconds` (what catching up costs)."""
        self.costs.observe_draft_prefill(seconds, num_tokens, now)

    def observe_target_prefill(
        self, seconds: float, num_tokens: int, beside_draft: bool, alone: bool, now: float
    ) -> None:
        """A new request's target prefill, with or without its draft's prefill beside it (what stalls cost)."""
        self.costs.observe_target_prefill(seconds, num_tokens, beside_draft, alone, now)

    def choose(self, batch_size: int, now: float) -> int:
        """The k for the next round of a session in a batch of `batch_size` sessions."""
        gap = now - self._seen_at
        self._serving_s += gap if 0.0 <= gap <= IDLE_GAP_S else 0.0
        self._seen_at = now
        if now - self._decided_at >= self.config.period_s and self._settled(now):
            self._decided_at = now
            self._switch(self._decide(batch_size, now), batch_size, now)
        return self._k

    def estimate(self, batch_size: int, k: int, now: float) -> Estimate | None:
        """Expected tokens per second per session at k, other sessions' prefills' stalls priced in: from k's
        measured rounds at this batch bucket, else from the cost model (draft steps, the verify of k + 1), else None."""
        costs = self.costs.bucket(batch_size)
        tokens = self.acceptance.expected_tokens(k)
        stall_s = tokens * self.costs.stall_per_token(batch_size, k > 0, now)
        measured = costs.round_s.get(k)
        if measured is not None and measured.mean is not None and measured.weight(now) > 0.0:
            error = measured.relative_error(now)
            return Estimate(tokens / max(measured.mean + stall_s, 1e-9), measured.weight(now), error)
        modelled = costs.modelled_round_s(k)
        return None if modelled is None else Estimate(tokens / max(modelled + stall_s, 1e-9), 0.0, modelled=True)

    def _borrowed_rate(self, batch_size: int, k: int, now: float) -> float | None:
        """k's rate from the nearest larger batch bucket that measured it, its round scaled by how a k measured
        at both compares. Never from a smaller batch: the larger the batch, the smaller speculation's share
        (the passes it shares grow with every window), so a smaller batch's rate overstates k here, and a
        switch from target-only under load costs every session's catch-up on top."""
        key = batch_bucket(batch_size)
        here = {r: m.mean for r, m in self.costs.bucket(batch_size).round_s.items() if m.mean and r != k}
        for bucket in sorted(b for b in self.costs.buckets if b > key):
            there = {r: m.mean for r, m in self.costs.buckets[bucket].round_s.items() if m.mean}
            reference = next((r for r in here if r in there), None)
            if k in there and reference is not None:
                tokens = self.acceptance.expected_tokens(k)
                round_s = there[k] * here[reference] / there[reference]
                return tokens / max(round_s + tokens * self.costs.stall_per_token(batch_size, k > 0, now), 1e-9)
        return None

    def _settled(self, now: float) -> bool:
        """A new k stands until enough of its rounds were measured to trust, or until four times as long as
        that should take has passed (rounds may stop being measured)."""
        if now < self._measured_from:
            return False
        needed = self.config.min_rounds
        return self._fresh_rounds >= needed or now - self._measured_from >= 4 * needed * self._last_round_s

    def _decide(self, batch_size: int, now: float) -> int:
        estimates = {k: e for k in range(self.max_k + 1) if (e := self.estimate(batch_size, k, now)) is not None}
        trusted = {k: e for k, e in estimates.items() if e.rounds >= self.config.min_rounds}
        if not trusted:
            return 0 if self._met_anew(batch_size) else self._k
        best = self._exploit(trusted, batch_size)
        self._chosen = best
        explored = self._explore(best, estimates, batch_size, now)
        self._charge_exploration(best, trusted, now, explores_on=explored is not None)
        return best if explored is None else explored

    def _met_anew(self, batch_size: int) -> bool:
        """A batch size first met after serving others, target-only not measured at it yet: then target-only
        comes first, the baseline every k is compared with and the quickest to measure (a deep k's batch
        rounds are the longest, and `min_rounds` of them must pass). A fresh policy drafts its initial k."""
        here = batch_bucket(batch_size)
        served_before = any(costs.round_s for bucket, costs in self.costs.buckets.items() if bucket != here)
        return served_before and 0 not in self.costs.bucket(batch_size).round_s

    def _exploit(self, trusted: dict[int, Estimate], batch_size: int) -> int:
        """The fastest trusted k, unless its lead over the last choice is within the noise or does not repay
        the switch within `hold_s`. Of k's within the noise of the fastest, the smallest counts as fastest:
        a deeper window costs more than its rounds show (its drafts' prefills and catch-ups, their share of
        shared cores), so speculation must win by more than the noise."""
        fastest = max(trusted, key=lambda k: trusted[k].rate)
        top = trusted[fastest]
        best = min(k for k, e in trusted.items()
                   if top.rate - e.rate <= math.hypot(e.relative_error, top.relative_error) * e.rate)  # fmt: skip
        held = self._chosen if self._chosen in trusted else self._k if self._k in trusted else best
        if best == held:
            return best
        a, b = trusted[held], trusted[best]
        noise = math.hypot(a.relative_error, b.relative_error)
        switch_s = self._switch_s(held, best, batch_size)
        gain = (b.rate - a.rate) * self.config.hold_s - a.rate * switch_s
        return best if gain > 0.0 and b.rate - a.rate > noise * a.rate else held

    def _explore(self, best: int, estimates: dict[int, Estimate], batch_size: int, now: float) -> int | None:
        """The k with the highest optimistic rate (discounted UCB: the bonus grows back as a figure ages),
        if its possible gain over `hold_s` pays switching there and the budget allows."""
        if self._lost_s > self.config.explore_fraction * self._serving_s:
            return None
        base = estimates[best].rate
        # k unknown here: the best's neighbours and target-only taken as fast as the best (the rate is about
        # unimodal in k), any k as fast as another batch bucket measured it where that is faster
        unknown = [k for k in range(self.max_k + 1) if k not in estimates]
        borrowed = {k: self._borrowed_rate(batch_size, k, now) or 0.0 for k in unknown}
        guessed = {k: Estimate(max(base, rate), 0.0) for k, rate in borrowed.items()}
        guessed = {k: e for k, e in guessed.items() if borrowed[k] > base or k in (best - 1, best + 1, 0)}
        candidates = {k: self._optimistic(e, base) for k, e in (estimates | guessed).items()}
        candidates = {k: r for k, r in candidates.items() if 0 <= k <= self.max_k and k != best}
        if not candidates:
            return None
        k = max(candidates, key=lambda x: candidates[x])
        # the way there only: coming back is paid when the exploration lost, from the budget
        if (candidates[k] - base) * self.config.hold_s <= base * self._switch_s(best, k, batch_size):
            return None
        return k

    def _optimistic(self, estimate: Estimate, base: float) -> float:
        """A modelled k gets no bonus: the model is what is known of it, and it already leans to speculation
        (the calls' costs leave out what drafts take from shared cores and from each new request)."""
        if estimate.modelled:
            return estimate.rate
        return estimate.rate * (1.0 + self.config.exploration_bonus / math.sqrt(1.0 + estimate.rounds))

    def _switch_s(self, old: int, new: int, batch_size: int) -> float:
        """Seconds a session loses to a change of k: leaving target-only, its draft first catches up on the
        context it missed; any change also leaves a round of the batch unmeasured."""
        catch_up = self.costs.catch_up_s(batch_size) if old == 0 and new > 0 else 0.0
        return catch_up + (self._last_round_s if old != new else 0.0)

    def _charge_exploration(self, best: int, trusted: dict[int, Estimate], now: float, explores_on: bool) -> None:
        """An exploration that has not become the best is charged its regret since the last decision (the
        seconds of serving at the best k's pace it lost); one that has is not, so a slope of k is climbed
        step after step. `explores_on`: this decision explores (further, or another k)."""
        explored = trusted.get(self._k)
        if self._explored_at is not None and self._k != best and explored is not None:
            shortfall = max(0.0, 1.0 - explored.rate / trusted[best].rate)
            self._lost_s += (now - self._explored_at) * shortfall
        self._explored_at = now if explores_on else None

    def _switch(self, k: int, batch_size: int, now: float) -> None:
        if k == self._k:
            return
        self._measured_from, self._fresh_rounds = now + self._last_round_s, 0.0
        figures = ", ".join(f"k={x} {self._rate_text(batch_size, x, now)}" for x in (self._k, k))
        logger.info("adaptive k %d -> %d at %d session%s (%stokens/s a session: %s)", self._k, k, batch_size,
                    "" if batch_size == 1 else "s", "exploring; " if k != self._chosen else "", figures)  # fmt: skip
        self._k = k

    def _rate_text(self, batch_size: int, k: int, now: float) -> str:
        estimate = self.estimate(batch_size, k, now)
        return "?" if estimate is None else f"{estimate.rate:.2f}"
