"""Whether pre-drafting pays for a session: a pre-draft saves its next propose call only when the whole
window is accepted (and the target's bonus token is the draft's own guess), yet every pre-draft costs a
call's host time (messages, Python) beside the verification it overlaps."""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.1  # of the newest round in each running figure: about the last ten count


@dataclass(slots=True)
class PredraftOdds:
    """A session's running figures: how often a window is accepted whole, what a propose call costs in all
    and what its host part costs. Pre-draft while the saving expected, P(whole window) x the propose call,
    exceeds one call's host time; until both calls were measured, pre-draft."""

    whole_rate: float = 1.0
    """Share of recent windows accepted in full (an upper bound on a pre-draft's chance to hold)."""
    propose_s: float | None = None
    """A propose call's seconds, as the round waited for it."""
    host_s: float | None = None
    """A propose call's seconds less the draft's compute: what one more call costs the host."""

    def pays(self) -> bool:
        if self.propose_s is None or self.host_s is None:
            return True
        return self.whole_rate * self.propose_s > self.host_s

    num_windows: int = 0

    def observe_window(self, num_drafted: int, num_accepted: int) -> None:
        """A verified window; the first ones are averaged plainly, so the start counts no more than they."""
        if num_drafted > 0:
            self.num_windows += 1
            whole = 1.0 if num_accepted >= num_drafted else 0.0
            self.whole_rate += max(WEIGHT, 1.0 / self.num_windows) * (whole - self.whole_rate)

    def observe_propose(self, seconds: float, compute_s: float) -> None:
        """A propose call the round waited for (not a pre-draft): its wall seconds and the draft's compute."""
        host_s = max(0.0, seconds - compute_s)
        self.propose_s = seconds if self.propose_s is None else self.propose_s + WEIGHT * (seconds - self.propose_s)
        self.host_s = host_s if self.host_s is None else self.host_s + WEIGHT * (host_s - self.host_s)
