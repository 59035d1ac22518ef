"""Per-window-position acceptance and the tokens a round at k emits on average."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def tokens_per_round(acceptances: Sequence[float]) -> float:
    """E(k) = 1 + a_0 + a_0 a_1 + ... + a_0 ... a_(k-1): tokens a window of k = len(acceptances) drafts emits
    on average, the recovered/bonus token included (vLLM's mean acceptance length), a_i being the
    acceptance at position i given that the drafts before it were accepted."""
    tokens, reach = 1.0, 1.0
    for rate in acceptances:
        reach *= rate
        tokens += reach
    return tokens


@dataclass(slots=True)
class AcceptanceModel:
    """a_i per window position, pooled over a replica's sessions. Per position rather than one rate because
    acceptance comes in runs: a window whose first drafts are right tends to be right to its end, so one
    per-token rate undervalues deep windows."""

    prior: float = 0.7
    """a_0 before anything was examined; each deeper position's prior is the position before it."""
    prior_weight: float = 2.0
    decay: float = 0.98
    accepted: list[float] = field(default_factory=list)
    """[i]: drafts at position i accepted, decayed per examination of i."""
    examined: list[float] = field(default_factory=list)
    """[i]: drafts at position i the target examined, decayed likewise."""

    def observe(self, num_accepted: int, num_drafted: int, stopped_early: bool = False) -> None:
        """One window: `num_drafted` drafts, the first `num_accepted` of them accepted. Positions after the
        first rejection were not examined. A window the draft ended early (`stopped_early`, all its drafts
        accepted) counts as a rejection at the next position: the round emits what one would."""
        num_examined = min(num_accepted + 1, num_drafted) + int(stopped_early and num_accepted == num_drafted)
        while len(self.examined) < num_examined:
            self.examined.append(0.0)
            self.accepted.append(0.0)
        # each position decays over its own examinations: a deep position the windows stopped reaching
        # keeps its figure instead of falling back to the prior
        for i in range(num_examined):
            self.examined[i] = self.decay * self.examined[i] + 1.0
            self.accepted[i] = self.decay * self.accepted[i] + float(i < num_accepted)

    def rates(self, k: int) -> list[float]:
        """a_0 .. a_(k-1), each measured figure pulled toward the position before it by `prior_weight`."""
        result, prior = [], self.prior
        for i in range(k):
            if i < len(self.examined):
                prior = (self.accepted[i] + self.prior_weight * prior) / (self.examined[i] + self.prior_weight)
            result.append(prior)
        return result

    def expected_tokens(self, k: int) -> float:
        """E(k), the recovered/bonus token included; 1 at k = 0."""
        return tokens_per_round(self.rates(k))
