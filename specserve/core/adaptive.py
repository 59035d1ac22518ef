"""Adaptive speculation length from measured round times: per target replica, the k with the most expected
tokens per second per session at about the current batch size, re-measuring the nearby choices (k - 1,
k + 1, target-only k = 0, and any close contender) now and then, so that k follows load and acceptance.

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

import logging
import math
from collections import deque
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

ACCEPTANCE_DECAY = 0.98  # acceptance: about the last fifty examinations of a position count
ROUNDS_KEPT = 8  # round times: about the last eight rounds of the batch count
ROUNDS_TRUSTED = 3  # ...and a figure is trusted after three...
MIN_TRUSTED = 8  # ...and at least eight session rounds: at one client a round is a pre-draft hit or a miss
# (0.35 or 0.53 s at k = 4), and three left a standard error of about 13%, more than k = 3..6 differ by
STALL = 2.0  # a round this many times the median stalled (held by something the prefill clock missed)
STALL_MEMORY_S = 120.0  # prefill stalls: about the last two minutes count (a prefill every few seconds)
STALL_TRUSTED_TOKENS = 64  # ...and a figure needs this many session tokens behind it
MAX_BACKOFF = 16  # a choice that keeps losing is measured again at most this many refresh periods apart
LAG_WEIGHT = 0.1  # drafts' lag at k = 0: about the last ten session rounds count


@dataclass(slots=True)
class RoundTime:
    """A session's round seconds at one (batch size, k), prefills' stalls taken out: the mean of the recent
    rounds of every session of the batch. A new request's prefill holds the target (and the draft) for a
    second or more whatever k is, and with a few rounds per figure one stall more or less swung the
    comparison between two k by 50% (measured at 8 clients: k flipping every few seconds); PrefillStall
    prices prefills over minutes instead."""

    batch_size: int
    recent: deque[float] = field(init=False)
    updated_at: float = -math.inf
    _seconds: float | None = None  # computed once per change: a decision reads every figure many times

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=ROUNDS_KEPT * max(2, self.batch_size))

    def observe(self, seconds: float, now: float) -> None:
        self.recent.append(seconds)
        self.updated_at, self._seconds = now, None

    @property
    def trusted(self) -> bool:
        return len(self.recent) >= trusted_after(self.batch_size)

    @property
    def seconds(self) -> float:
        if self._seconds is None:
            ordered = sorted(self.recent)
            kept = [s for s in ordered if s <= STALL * ordered[len(ordered) // 2]]
            self._seconds = sum(kept) / len(kept)
        return self._seconds


@dataclass(slots=True)
class Decayed:
    """A ratio of two sums (seconds per token, say), each decayed over STALL_MEMORY_S: at 16 clients a
    prefill comes every few seconds, and a figure of a few rounds caught one or none."""

    numerator: float = 0.0
    denominator: float = 0.0
    updated_at: float = -math.inf

    def observe(self, numerator: float, denominator: float, now: float) -> None:
        decay = math.exp(-max(0.0, now - self.updated_at) / STALL_MEMORY_S) if self.denominator else 0.0
        self.numerator = decay * self.numerator + numerator
        self.denominator = decay * self.denominator + denominator
        self.updated_at = max(self.updated_at, now)

    def ratio(self, trusted_after: float = 0.0) -> float | None:
        """None until the denominator reaches `trusted_after` (and while it is 0)."""
        if self.denominator <= 0.0 or self.denominator < trusted_after:
            return None
        return self.numerator / self.denominator


@dataclass(slots=True)
class PrefillStall:
    """What other sessions' prefills cost a session's rounds, at every k alike but for one thing.

    `per_token`, per batch size: seconds prefills held a session, per token it emitted and per other session
    of the batch (about a prefill's seconds over a request's tokens), pooled over every k. Priced apart per k
    from its own rounds, target-only's figure came only from explorations of a few seconds and kept what
    they caught: at 16 clients the first prefills of all sessions at once held it at several times its
    steady 0.004 s (target-only read 2.1-2.6 tokens/s a session where it served 3.0, and speculation won
    at 0.92x). The one thing k changes: while speculating, a new request's draft prefills beside its
    target's (on shared cores, slowing it: 5.6 ms a prompt token instead of 3.8 here). `prefill_s` measures
    both kinds per prompt token, from prefills that ran alone (one beside another waits for it), and scales
    the pooled figure by how each compares with the mix of the two behind it."""

    per_token: dict[int, Decayed] = field(default_factory=dict)
    """bucket: seconds per emitted token and other session of the batch."""
    prefill_s: dict[bool, Decayed] = field(default_factory=dict)
    """beside a draft's prefill: a target prefill's seconds per prompt token."""
    beside_draft: Decayed = field(default_factory=Decayed)
    """The share of the prefills with a draft's beside."""

    def observe_round(self, bucket: int, stalled_s: float, tokens: int, now: float) -> None:
        self.per_token.setdefault(bucket, Decayed()).observe(stalled_s, tokens, now)

    def observe_prefill(self, seconds: float, prompt_tokens: int, beside_draft: bool, alone: bool, now: float) -> None:
        self.beside_draft.observe(float(beside_draft), 1.0, now)
        if alone and prompt_tokens > 0:
            self.prefill_s.setdefault(beside_draft, Decayed()).observe(seconds, prompt_tokens, now)

    def seconds(self, bucket: int, speculating: bool) -> float:
        """Per emitted token and other session, at the nearest bucket with a trusted figure; 0 where none is
        (at one client a session's rounds run beside no other session's prefill)."""
        figures = {b: x for b, stall in self.per_token.items() if (x := stall.ratio(STALL_TRUSTED_TOKENS)) is not None}
        nearest = min(figures, key=lambda b: abs(b - bucket), default=None)
        return 0.0 if nearest is None else figures[nearest] * self._weight(speculating)

    def _weight(self, speculating: bool) -> float:
        """A prefill's seconds with or without a draft's beside over the pooled mix's; 1 until both kinds
        were measured."""
        with_draft, alone = (self.prefill_s.get(flag, Decayed()).ratio() for flag in (True, False))
        share = self.beside_draft.ratio()
        if with_draft is None or alone is None or share is None:
            return 1.0
        mixed = share * with_draft + (1.0 - share) * alone
        return (with_draft if speculating else alone) / mixed


def trusted_after(batch_size: int) -> int:
    """Session rounds a round-time figure needs to be trusted."""
    return max(MIN_TRUSTED, ROUNDS_TRUSTED * batch_size)


def tokens_per_round(acceptances: list[float]) -> float:
    """Tokens a window emits on average, the recovered/bonus token included: 1 + a_0 + a_0 a_1 + ..., a_i being
    the acceptance at position i given that the drafts before it were accepted."""
    tokens, reach = 1.0, 1.0
    for rate in acceptances:
        reach *= rate
        tokens += reach
    return tokens


def _rate_text(rate: float | None) -> str:
    return "?" if rate is None else f"{rate:.2f}"


def batch_bucket(batch_size: int) -> int:
    """Half-octave buckets (1, 2, 3, 4, 5-6, 7-9, 10-13, 14-19, ...): nearby batch sizes cost about the same."""
    return round(2 * math.log2(max(1, batch_size)))


def bucket_batch_size(bucket: int) -> int:
    """A batch size of the bucket (the one at its middle: 8 for 7-9)."""
    return max(1, round(2 ** (bucket / 2)))


@dataclass(slots=True)
class Exploration:
    """A choice other than the best being measured, and what the sessions emitted meanwhile, stalls included:
    an exploration from target-only first makes every session's draft catch up on its context, a stall the
    round times leave out."""

    bucket: int
    baseline: float
    """Tokens per second per session it is held against, measured at its batch size (AdaptiveK._pace_here)."""
    started_at: float
    sessions: int = 1
    serving_s: float = 0.0
    tokens: int = 0
    session_s: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.session_s += seconds

    def lost_s(self, now: float) -> float:
        """Seconds of serving it lost: its share of tokens short of the baseline's pace, times its duration
        (wall time: at 16 clients the catch-up alone can leave no session deciding for seconds)."""
        if self.session_s <= 0.0 or self.baseline <= 0.0:
            return 0.0
        return (now - self.started_at) * max(0.0, 1.0 - self.tokens / self.session_s / self.baseline)


@dataclass(slots=True)
class Choice:
    """The k a batch size last chose as best, since when, and when a decision last chose it again."""

    k: int
    since: float
    confirmed_at: float

    def held_zero_for(self, seconds: float) -> bool:
        return self.k == 0 and self.confirmed_at - self.since >= seconds


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
    """Decisions come at most this often (and after a change, only once the new k's figure can be trusted)."""
    refresh_s: float = 30.0
    """Another choice is measured again when its figure is older than this (four times longer when it was
    more than a quarter slower: exploring a bad choice costs more)."""
    explore_fraction: float = 0.1
    """At most this share of the time the replica serves goes to measuring choices other than the best: an
    exploration lasts a few rounds (the change settling, then enough measured to trust), which under load is
    seconds. An exploration that finds a faster k is not charged: a slope of k is then climbed step after
    step."""
    switch_margin: float = 0.05
    """Another measured k replaces the current one only when this much faster: round times are noisy, and
    every change costs a settling round."""
    explore_cost_share: float = 0.005
    """After an exploration that lost, the next at its batch size waits until what that one cost (the tokens
    it lost against the best k's pace, in seconds of serving) is this share of the time between them (a
    missing target-only figure excepted). At 4 to 16 clients on shared cores an exploration from
    target-only makes every session's draft catch up on its whole context first (seconds of stall), and
    explorations every 30 s or so cost adaptive 11% against target-only; alone, a neighbouring k costs a
    few percent of a few rounds, and the next follows soon."""
    target_only_margin: float = 0.05
    """Speculation is chosen only when this much faster than target-only: the rule is never slower than
    target-only, and a gain under 5% forgone costs less than a loss taken. It was 10% while target-only's
    figure left out prefills and speculation's did not (observe); with both alike, the 11% that k = 4 gains
    at 8 clients measured 9-12% in the policy's figures, and flipped around a 10% margin."""
    lead_share_cap: float = 0.02
    """At target-only, where speculation last measured faster here (by less than the margins that leave), k
    is measured again once the gain that lead would have given since the last departure pays for the drafts'
    catch-up, the lead counted up to this share: a wrong lead then costs at most about this share of the
    time serving (the 0.98x target-only that issue 5 allows), and a right one is not forgone for minutes.
    At 4 clients and T = 0.7 here target-only was chosen on k = 6 reading 4.5% faster, and the catch-up
    priced at `explore_cost_share` held it there for the remaining five minutes of the sweep's turns."""
    prior_acceptance: float = 0.7
    prior_weight: float = 2.0
    times: dict[tuple[int, int], RoundTime] = field(default_factory=dict)
    stalls: PrefillStall = field(default_factory=PrefillStall)
    """What other sessions' prefills cost a session's rounds."""
    accepted_at: list[float] = field(default_factory=list)
    """[i]: drafts at window position i accepted (decayed), among examined_at[i] the target examined."""
    examined_at: list[float] = field(default_factory=list)
    _k: int = 0
    _chosen: int = 0
    """The last k chosen as best (the one explorations return to)."""
    _decided_at: float = -math.inf
    _serving_s: float = 0.0
    _exploring_s: float = 0.0
    """Serving time spent on explorations that did not find a faster k."""
    _fresh: int = 0
    """Rounds measured at the current k since it was set."""
    _seen_at: float = -math.inf
    _last_round_s: float = 0.0
    _settled_at: float = -math.inf
    _losses: dict[tuple[int, int], int] = field(default_factory=dict)
    """(bucket, k): explorations of k there in a row that did not make it the best."""
    _cut_short_at: dict[tuple[int, int], float] = field(default_factory=dict)
    """(bucket, k > 0): when an exploration of k last ended before k's figure there could be trusted, its rounds
    there so far slower than the k chosen instead (_note_cut_short)."""
    _since: dict[int, float] = field(default_factory=dict)
    """bucket: when the replica first decided at that batch size."""
    _served_s: dict[int, float] = field(default_factory=dict)
    """bucket: serving seconds spent at that batch size. Not the time since it was first seen: between two
    load turns the sessions of both are counted for a moment, and 16 sessions most likely seen so in the
    8-client turns made a k missing at 16 due on the 16-client load's first decisions (k = 1, then k = 4,
    every draft catching up each time)."""
    _exploration: Exploration | None = None
    _quiet_until: dict[int, float] = field(default_factory=dict)
    """bucket: nothing but a missing target-only figure is explored there before this time."""
    draft_prefill_s: Decayed = field(default_factory=Decayed)
    """A draft's prefill seconds per token: what a draft catching up on its context costs (on shared cores
    the target's sessions wait meanwhile)."""
    _draft_lag: float = 0.0
    """Context tokens a session's draft lacks, over the recent rounds at k = 0: at k = 0 a draft falls behind
    by every token, and a new request's is not prefilled at all."""
    _left_at: dict[int, float] = field(default_factory=dict)
    """bucket: when target-only was last left there."""
    _chosen_at: dict[int, Choice] = field(default_factory=dict)
    """bucket: the k last chosen as best there, and since when."""

    def __post_init__(self) -> None:
        self._k = self._chosen = min(self.initial_k, self.max_k)

    @property
    def k(self) -> int:
        """The k chosen last (what sessions draft now)."""
        return self._k

    def acceptance(self, position: int) -> float:
        """a_i: acceptance at window position i given the drafts before it were accepted."""
        return self.acceptances(position + 1)[position]

    def acceptances(self, k: int) -> list[float]:
        """a_0 .. a_(k-1), each measured figure pulled toward the position before it (`prior_acceptance` for
        the first) with `prior_weight`: a position rarely examined (deeper than the windows lately) takes
        about the acceptance of the one before it (acceptance comes in runs: if anything an underestimate)."""
        rates, prior = [], self.prior_acceptance
        for i in range(k):
            if i < len(self.examined_at) and self.examined_at[i] + self.prior_weight > 0:
                prior = (self.accepted_at[i] + self.prior_weight * prior) / (self.examined_at[i] + self.prior_weight)
            rates.append(prior)
        return rates

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a round at k emits on average, the recovered/bonus token included."""
        return tokens_per_round(self.acceptances(k))

    def observe(
        self,
        batch_size: int,
        k: int,
        num_accepted: int,
        seconds: float,
        now: float,
        stalled_s: float = 0.0,
        draft_lag: int = 0,
        asked: int | None = None,
        drafted: int | None = None,
    ) -> None:
        """One session's round at the policy's `k`: `num_accepted` drafts accepted, `seconds` since its previous
        round ended (waits and overlap included), `stalled_s` of them while a prefill ran on the target replica
        (a new request's, or a session's rebuilt). The round's time counts without its stall, and the stall
        goes to PrefillStall, priced at every k alike: the median rule caught a prefill's 0.4 s in a 0.2 s
        target-only round but not in a 1 s round at k = 4 (k = 0 chosen at 8 clients where k = 4 gave
        1.11x), and leaving out the rounds beside a prefill kept the long rounds that were lucky (at 16
        clients most ran beside one: k = 8 looked 25% faster than k = 0 and served 0.97x). `draft_lag`: context
        tokens the session's draft lacks (at k = 0, what leaving target-only makes it catch up on).

        `asked`: drafts the window asked for (k, fewer near the request's token budget); `drafted`: drafts
        the draft gave (fewer than asked when it ended the window on a token it was unsure of). The round's
        time counts under k whatever its window: in a batched pass the deepest window sets the cost, and
        counted under their own length, a request's last round (k = 0) and the draft's early stops (one
        round in six or five at k = 3-4 here) made every shorter k, target-only first, look as slow as k (at 8
        clients target-only read 3.0 tokens/s a session where it served 3.5). A window the draft ended
        early counts for the acceptance as a rejection where it ended: the round emits what one would,
        and E(k) counted over full windows only made k = 3 and 4 look 4-6% better than they served."""
        asked = k if asked is None else min(asked, k)
        drafted = asked if drafted is None else min(drafted, asked)
        if k == 0:
            self._draft_lag += LAG_WEIGHT * (draft_lag - self._draft_lag)
        elif asked > 0:
            self._count_acceptance(num_accepted, drafted, stopped=drafted < asked and num_accepted == drafted)
        self._last_round_s = seconds
        if self._exploration is not None:
            self._exploration.observe(num_accepted + 1, seconds)
        bucket, stalled_s = batch_bucket(batch_size), min(max(stalled_s, 0.0), seconds)
        if batch_size > 1:  # whatever the k (pooled: PrefillStall)
            self.stalls.observe_round(bucket, stalled_s / (batch_size - 1), num_accepted + 1, now)
        if now - seconds < self._settled_at:
            # Started while other sessions still ran the previous k: in one batched pass their tokens set
            # the cost, so a deeper window would look nearly free (measured: k climbing to 8 at 16 clients);
            # and after leaving target-only, drafts catching up stall these rounds (the exploration's cost).
            return
        key = (bucket, min(k, self.max_k))
        self.times.setdefault(key, RoundTime(batch_size)).observe(seconds - stalled_s, now)
        if k == self._k:
            self._fresh += 1

    def _count_acceptance(self, num_accepted: int, drafted: int, stopped: bool) -> None:
        """Examined up to the first rejection (or the draft's stop: `stopped`); each position's figure decays
        over its own examinations, not over all rounds: decayed while k stayed below it, a deep position fell
        back to the prior, which made deep windows look worse than they were and kept k small (k = 2 where
        4 was best)."""
        examined = min(num_accepted + 1, drafted) + stopped
        grow = examined - len(self.examined_at)
        if grow > 0:
            self.examined_at.extend([0.0] * grow)
            self.accepted_at.extend([0.0] * grow)
        for i in range(examined):
            self.examined_at[i] = ACCEPTANCE_DECAY * self.examined_at[i] + 1.0
            self.accepted_at[i] = ACCEPTANCE_DECAY * self.accepted_at[i] + (i < num_accepted)

    def choose(self, batch_size: int, now: float) -> int:
        bucket = batch_bucket(batch_size)
        self._count_time(bucket, now)
        if now - self._decided_at >= self.period_s and self._settled(batch_size, now):
            k = self._decide(bucket, batch_size, now)
            if k != self._k:
                self._settled_at, self._fresh = now + self._last_round_s, 0
                logger.info(
                    "adaptive k %d -> %d at %d session%s (%stokens/s a session: %s)",
                    self._k,
                    k,
                    batch_size,
                    "" if batch_size == 1 else "s",
                    "exploring; " if self._exploration is not None else "",
                    ", ".join(f"k={x} {_rate_text(self.estimate(bucket, x))}" for x in (self._k, k)),
                )
            self._k, self._decided_at = k, now
        return self._k

    def _settled(self, batch_size: int, now: float) -> bool:
        """A new k stands until the rounds in flight at the change have ended and enough rounds were measured
        at it to trust its figure (or four times as long as that takes, should rounds stop being measured):
        at 8 clients an exploration that ended after a fixed three round times (or twice that) had often too
        few rounds to be trusted, another request's prefill having stalled one, so it measured nothing."""
        if now < self._settled_at:
            return False
        needed = trusted_after(batch_size)
        waited_rounds = (now - self._settled_at) / max(self._last_round_s, 1e-9)
        return self._fresh >= needed or waited_rounds >= 4 * needed / batch_size

    def estimate(self, bucket: int, k: int) -> float | None:
        """Expected tokens per second per session at (bucket, k): from its round time at this bucket, else
        from the nearest bucket where k was measured, scaled by how round times differ between the two
        (unscaled, a small batch's figure made target-only look fast at 16 clients); None when neither."""
        seconds = self._seconds(bucket, k)
        if seconds is None:
            others = sorted((b for b, kk in self.times if kk == k and b != bucket), key=lambda b: abs(b - bucket))
            seconds = next((s for b in others if (s := self._borrowed(bucket, b, k)) is not None), None)
        return None if seconds is None else self._rate(bucket, k, seconds)

    def _rate(self, bucket: int, k: int, seconds: float) -> float:
        """Tokens per second per session at k from a round's seconds without stalls, other sessions'
        prefills priced in: per emitted token, PrefillStall's figure for each other session of the batch."""
        tokens = self.expected_tokens(k)
        stalled_s = tokens * self.stall_per_token(bucket, k > 0) * (bucket_batch_size(bucket) - 1)
        return tokens / max(seconds + stalled_s, 1e-9)

    def stall_per_token(self, bucket: int, speculating: bool) -> float:
        """Seconds other sessions' prefills hold a session per token it emits and other session (PrefillStall)."""
        return self.stalls.seconds(bucket, speculating)

    def observe_draft_prefill(self, seconds: float, tokens: int, now: float) -> None:
        """A draft prefilled `tokens` tokens of a session's context in `seconds`."""
        if tokens > 0:
            self.draft_prefill_s.observe(seconds, tokens, now)

    def observe_prefill(self, seconds: float, prompt_tokens: int, beside_draft: bool, alone: bool, now: float) -> None:
        """A target prefill of `prompt_tokens` tokens took `seconds`, a draft's prefill beside it or not, and
        `alone` when no other prefill on the replica overlapped it."""
        self.stalls.observe_prefill(seconds, prompt_tokens, beside_draft, alone, now)

    def _borrowed(self, bucket: int, other: int, k: int) -> float | None:
        there, scale = self._seconds(other, k), self._scale(bucket, other)
        return there * scale if there is not None and scale is not None else None

    def _scale(self, bucket: int, other: int) -> float | None:
        """Round times at `bucket` over those at `other`, from a k measured at both (the current one if it is)."""
        for k in [self._k, *range(self.max_k + 1)]:
            here, there = self._seconds(bucket, k), self._seconds(other, k)
            if here is not None and there is not None:
                return here / there
        return None

    def _seconds(self, bucket: int, k: int) -> float | None:
        round_time = self.times.get((bucket, k))
        return round_time.seconds if round_time is not None and round_time.trusted else None

    def _count_time(self, bucket: int, now: float) -> None:
        """Serving time (gaps over 5 s are idle), per batch size too, and the part of it spent exploring."""
        gap = now - self._seen_at
        serving = gap if 0.0 <= gap <= 5.0 else 0.0
        self._serving_s += serving
        self._served_s[bucket] = self._served_s.get(bucket, 0.0) + serving
        if self._exploration is not None:
            self._exploration.serving_s += serving
        self._seen_at = now

    def _decide(self, bucket: int, batch_size: int, now: float) -> int:
        estimates = {k: self.estimate(bucket, k) for k in range(self.max_k + 1)}
        known = {k: rate for k, rate in estimates.items() if rate is not None}
        explored = self._k if self._exploration is not None else None
        self._since.setdefault(bucket, now)
        if not known:  # a batch size nothing was measured at yet: measure the chosen k there first
            self._end_exploration(won=False, now=now)
            return self._chosen
        best = measured_best = max(known, key=lambda k: known[k])
        chosen = known.get(self._chosen)
        if chosen is not None and self._seconds(bucket, self._chosen) is not None:
            # Within the noise: no change. Against the last k chosen as best, not the one just explored, or
            # every exploration that measured about as fast would stick (k drifted to 5 at 8 clients).
            if known[best] <= (1 + self.switch_margin) * chosen:
                best = self._chosen
        if 0 in known and known[best] <= (1 + self.target_only_margin) * known[0]:
            # Speculation has to beat target-only by the margin: within the noise the cheaper k = 0 wins, as
            # never slower than target-only asks (at 4 clients k = 1..3, each about as fast, kept it 9% slower)
            best = 0
        quiet = self._quiet(bucket, now)
        held = now < self._leaving_allowed_at(bucket, batch_size, known)
        if explored is None and self._k == 0 and best > 0:
            # Leaving target-only on figures measured before (k = 0's drifting below another's old, lucky one:
            # at 4 clients it switched back and forth; or another batch size's, the batch growing and shrinking
            # by one) is tried as an exploration, when one may be: every session's draft has to catch up first.
            # And only on a figure faster by the switch margin too: at 16 clients k went from 0 to 4 or 5 and
            # back every 10-15 s on figures 5-7% apart, each time with every draft catching up (0.91x
            # target-only, where k = 4 fixed served 1.01x).
            # Nor, where speculation lost at a smaller batch size, or an exploration of this k here was cut short
            # slower (its figure here still borrowed: _note_cut_short), before `_due` would measure it again here.
            waiting = self._speculation_lost_below(bucket) or self._cut_short(bucket, best)
            waiting = waiting and not self._due(bucket, best, known[best], estimates[best], now)
            margin = 1 + self.target_only_margin + self.switch_margin
            if quiet or held or waiting or known[best] <= margin * known[0]:
                return 0
            self._left_at[bucket] = now
            self._exploration = Exploration(bucket, self._pace_here(bucket, known, 0), now, batch_size)
            return best
        self._chosen = best
        choice = self._chosen_at.get(bucket)
        if choice is None or choice.k != best:
            self._chosen_at[bucket] = Choice(best, since=now, confirmed_at=now)
        else:
            choice.confirmed_at = now
        if explored:  # speculation backs off; target-only, which it must beat, does not
            self._losses[bucket, explored] = 0 if explored == best else self._losses.get((bucket, explored), 0) + 1
            self._note_cut_short(explored, best, now)
        # A losing exploration is charged to the budget, a winning one is not: climbing a slope of k one
        # step at a time (k = 1 to 4 at one client) then takes seconds, not a minute of rationed steps.
        self._end_exploration(won=explored == best, now=now)
        quiet = self._quiet(bucket, now)  # again: a loss just ended quiets the batch size from now on
        budget = self.explore_fraction * self._serving_s
        if budget <= 0.0:
            return best
        rationed = self._exploring_s > budget
        # Around the fastest measured, so that a slope of small steps (each within the margin) is climbed;
        # and any k measured here as a contender again once its figure is stale, so that an early figure
        # (taken while the first requests were all prefilling) cannot keep a good k out for good.
        contenders = {k for k, rate in known.items() if rate >= 0.75 * known[measured_best]}
        around = {measured_best - 1, measured_best + 1, 0} | contenders
        candidates = {k for k in around if 0 <= k <= self.max_k and k != best}
        if rationed:
            # Out of budget, a batch speculating still re-measures target-only: a figure of it taken in a bad
            # moment (eight rounds, one stalled by a prefill) otherwise kept k = 1 at 0.9x standing for good (seen
            # replaying the 16-client load of a sweep, `specserve.bench.adaptive_replay`).
            candidates &= {0} if bucket > 0 else set()
        if quiet:  # but target-only, which speculation must beat, is measured wherever it is missing
            candidates &= {0} if self._seconds(bucket, 0) is None else set()
        elif held:  # at target-only a k never measured here still is (what _due allows), not one measured again
            candidates = {k for k in candidates if self._seconds(bucket, k) is None}
        due = [k for k in candidates if self._due(bucket, k, known[best], estimates[k], now)]
        if not due:
            return best
        # The stalest first. Between two never measured: alone on the target, the deeper neighbour first (a
        # pass costs about as much for k + 1 tokens as for one, and a slow k = 0 or k - 1 lost, then held the
        # climb to deeper windows back); in a batch, target-only first, which speculation must beat (at 16
        # clients three minutes went by at k = 3..5, 0.68x target-only, before k = 0 was measured).
        alone = bucket == 0
        explored = min(due, key=lambda k: (self._updated_at(bucket, k), (k == 0) == alone, -k if alone else k))
        if self._k == 0 and explored > 0:
            self._left_at[bucket] = now
        self._exploration = Exploration(bucket, self._pace_here(bucket, known, best), now, batch_size)
        return explored

    def _quiet(self, bucket: int, now: float) -> bool:
        """Whether the batch size explores nothing but a missing target-only figure now (_end_exploration)."""
        return now < self._quiet_until.get(bucket, -math.inf)

    def _pace_here(self, bucket: int, known: dict[int, float], best: int) -> float:
        """What an exploration's tokens are held against: the best k's pace measured at this batch size, else
        target-only's measured here, else nothing (0: no loss charged). Not a pace borrowed from another batch
        size: at 2 clients the one-client k = 5 figure (rounds in turn, the draft on both cores), scaled by
        target-only's round times, priced a 3 s exploration at 1.5 s lost, and the batch size sat at k = 0
        for five minutes while k = 5 served it 1.4x faster."""
        for k in (best, 0):
            if k in known and self._seconds(bucket, k) is not None:
                return known[k]
        return 0.0

    def _speculation_lead(self, bucket: int, known: dict[int, float]) -> float:
        """How much faster than target-only the fastest k > 0 measured at this batch size reads (a share; 0
        where none reads faster, or either is missing here). Not from figures borrowed from another batch
        size: one client's 2.3x scaled to 16 clients would make every departure look worth its catch-up."""
        if 0 not in known or self._seconds(bucket, 0) is None:
            return 0.0
        measured = [rate for k, rate in known.items() if k > 0 and self._seconds(bucket, k) is not None]
        return max(0.0, max(measured, default=0.0) / known[0] - 1.0)

    def _leaving_allowed_at(self, bucket: int, batch_size: int, known: dict[int, float]) -> float:
        """Before this time a batch size at target-only does not leave it, to measure a k again or for one
        measured faster (a k never measured there still is): until what leaving would cost now is
        `explore_cost_share` of the time since it last left target-only (or was first seen), or speculation's
        lead here (`_speculation_lead`, up to `lead_share_cap`) of it where that is larger. What leaving costs:
        every session's draft catching up on the context tokens it lacks, at a draft prefill's seconds per token.
        At 16 clients after 30 s at k = 0 a re-measurement of k = 4 and 5 cost 0.92x target-only over the window,
        the catch-up unseen in the round times; priced per session by what the last departure lost, the first
        departure at 16 clients had been let through by one at 8 whose drafts lacked nothing. Holding back first
        measurements as well kept a fresh policy at 8 clients at k = 0 from its first seconds (0.94x target-only,
        where k = 4 served 1.04x); leaving at once for a k measured much faster, as earning the catch-up back
        within a refresh period, cost a fresh policy at 8 clients 2% in replays (its first target-only figures
        are thin)."""
        cost_s = self._leaving_cost_s(batch_size)
        if self._k != 0 or cost_s <= 0.0:
            return -math.inf
        lead = self._speculation_lead(bucket, known)  # only at target-only: not on every round's decision
        share = max(self.explore_cost_share, min(lead, self.lead_share_cap))
        return self._left_at.get(bucket, self._since[bucket]) + cost_s / share

    def _leaving_cost_s(self, batch_size: int) -> float:
        """Serving seconds leaving target-only would cost now (the drafts' catch-up); 0 until measured."""
        return (self.draft_prefill_s.ratio() or 0.0) * self._draft_lag * batch_size

    def _end_exploration(self, won: bool, now: float) -> None:
        """A losing exploration is charged to the budget, and its batch size explores nothing else (but a
        missing target-only figure) until the seconds it lost are `explore_cost_share` of the time since."""
        exploration, self._exploration = self._exploration, None
        if exploration is None:
            return
        lost_s = exploration.lost_s(now)
        if won:
            return
        self._exploring_s += exploration.serving_s
        quiet_s = lost_s / self.explore_cost_share
        self._quiet_until[exploration.bucket] = max(self._quiet_until.get(exploration.bucket, -math.inf), now + quiet_s)

    def _note_cut_short(self, k: int, best: int, now: float) -> None:
        """The exploration of k ends, `best` chosen instead. Where it measured k too few rounds to trust
        (_settled's fallback ended it, or the batch changed size), k's figure there is still missing, and a
        missing figure is due at once: at 16 clients k = 3 was explored twice within a minute, 12% below
        target-only both times. So where k measured slower than `best` so far, _due takes it as measured now
        (a loss); where faster, it stays due, to be measured on."""
        exploration = self._exploration
        if exploration is None or k == best:
            return
        for (bucket, measured_k), round_time in self.times.items():
            if measured_k != k or round_time.trusted or round_time.updated_at < exploration.started_at:
                continue
            best_rate = self.estimate(bucket, best)
            if best_rate is not None and self._rate(bucket, k, round_time.seconds) < best_rate:
                self._cut_short_at[bucket, k] = now
            else:
                self._cut_short_at.pop((bucket, k), None)

    def _cut_short(self, bucket: int, k: int) -> bool:
        """Whether k's figure here cannot be trusted yet, and an exploration of it measured it slower
        (_note_cut_short)."""
        return (bucket, k) in self._cut_short_at and self._seconds(bucket, k) is None

    def _due(self, bucket: int, k: int, best_rate: float, estimate: float | None, now: float) -> bool:
        """Whether k's figure at this bucket is missing or stale. Stale after `refresh_s`, four times that for a
        k more than a quarter slower, and for k > 0 twice as long again after every exploration of it in a row
        that lost (up to MAX_BACKOFF times). At 8 clients here target-only was best and adaptive ran 10-17%
        slower; held at k = 0 it ran as fast as target-only, so the loss was re-measuring k = 1, 2 and 4
        every 30 s, each time with the draft catching up on every session's context on the target's cores.
        A figure an exploration left untrusted and slower (_note_cut_short) is stale as if measured then.

        Where a smaller batch size measured speculation and kept choosing target-only for a refresh period
        (_speculation_lost_below), speculation is measured here only every period of serving per session of
        the batch (up to MAX_BACKOFF periods), missing or not: a larger batch tends to leave speculation less
        to gain, and an exploration from target-only costs more the more sessions' drafts catch up first; its
        first measurements at 8 and 16 clients cost 11-19% of a 60 s window at a mean k under 0.05 (at 16
        clients, after k = 5 had tied target-only at 8, a first k = 1 cost 0.92x target-only at a mean k of
        0.0). Not MAX_BACKOFF periods at every size: on this host speculation gained more at 4 clients than
        at 2 (k = 4 1.59x against 1.11x target-only), and after 2 clients chose target-only, 4 clients
        served target-only through all of a sweep's four turns. A k > 0 missing here whose figure borrowed from
        another batch size is more than a quarter slower waits four periods of serving at this batch size
        (_served_s), as a stale slow one does: at 16 clients k = 1, borrowed at 0.55x target-only, was explored
        at once, every draft catching up on its session's context first (0.93x target-only over the window
        at a mean k of 0.2)."""
        lost_below = k > 0 and self._speculation_lost_below(bucket)
        lost_below_periods = min(MAX_BACKOFF, bucket_batch_size(bucket))  # one a session
        slower = estimate is not None and estimate < 0.75 * best_rate
        measured_at = self._cut_short_at[bucket, k] if self._cut_short(bucket, k) else self._updated_at(bucket, k)
        if measured_at == -math.inf:
            if not lost_below and not (k > 0 and slower):
                return True
            return self._served_s.get(bucket, 0.0) > self.refresh_s * (lost_below_periods if lost_below else 4)
        losses = self._losses.get((bucket, k), 0) if k > 0 else 0
        periods = lost_below_periods if lost_below else min(MAX_BACKOFF, (4 if slower else 1) * 2**losses)
        return now - measured_at > self.refresh_s * periods

    def _speculation_lost_below(self, bucket: int) -> bool:
        """Whether the nearest smaller bucket where speculation was measured chose target-only there last (as
        it does where no k beat target-only by `target_only_margin`) and kept choosing it for a refresh period.
        What it chose, not its figures now: a larger batch's ramp-up passes through it at k = 0 while prompts
        prefill, and those slow rounds made speculation look ahead there after it had lost (16 clients then
        explored k = 1: 0.93x target-only). Kept for a period: one choice on figures that had drifted (at 2
        clients, k = 5 2.31 against k = 0 2.42 tokens/s a session where k = 4-5 had served 1.4x) otherwise
        held every larger batch at target-only (4 clients at k = 0, where speculation had served 1.2-1.4x)."""
        for smaller in sorted((b for b in self._chosen_at if b < bucket), reverse=True):
            if any(self._seconds(smaller, k) is not None for k in range(1, self.max_k + 1)):
                return self._chosen_at[smaller].held_zero_for(self.refresh_s)
        return False

    def _updated_at(self, bucket: int, k: int) -> float:
        """When k's figure at this bucket was last measured; -inf while it cannot be trusted yet (a few k = 0
        rounds of sessions whose draft was not ready otherwise ranked target-only after every never-measured
        k: on a fresh server at 8 clients k stepped down 4, 3, 2 before k = 0 was measured)."""
        round_time = self.times.get((bucket, k))
        return round_time.updated_at if round_time is not None and round_time.trusted else -math.inf
