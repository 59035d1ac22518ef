"""The adaptive-k policy's tuning values: one frozen dataclass, each field's meaning beside it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """How the policy learns and how boldly it changes k. The defaults suit CPU and GPU engines alike;
    the reasoning behind them is in docs/design/adaptive-k.md."""

    max_k: int = 8
    """The deepest window the policy may choose (k = 0, target-only, is always allowed)."""
    initial_k: int = 4
    """k until anything was measured."""
    prior_acceptance: float = 0.7
    """Acceptance assumed for a window position nothing was measured at."""
    prior_weight: float = 2.0
    """How many examinations the prior counts for against measured ones."""
    acceptance_decay: float = 0.98
    """Per examination of a position, the weight kept by the older ones (about the last fifty count)."""
    cost_half_life_s: float = 30.0
    """Seconds after which a cost measurement counts half: costs follow load and the host."""
    min_rounds: int = 8
    """Batch rounds a (batch size, k) needs before its round time is trusted and compared."""
    period_s: float = 1.0
    """Decisions come at most this often."""
    hold_s: float = 20.0
    """How long a chosen k is expected to stand: a switch must repay its cost within this time."""
    exploration_bonus: float = 0.15
    """Optimism for a k measured once (divided by the square root of its rounds): UCB's bonus."""
    explore_fraction: float = 0.03
    """At most this share of the serving time is lost (in tokens, at the best k's pace) to explorations."""

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"max_k must be at least 1, got {self.max_k}")
        if not 0 <= self.initial_k <= self.max_k:
            raise ValueError(f"initial_k must be in [0, max_k={self.max_k}], got {self.initial_k}")
        if not 0.0 < self.prior_acceptance < 1.0:
            raise ValueError(f"prior_acceptance must be in (0, 1), got {self.prior_acceptance}")
        if not 0.0 < self.acceptance_decay <= 1.0:
            raise ValueError(f"acceptance_decay must be in (0, 1], got {self.acceptance_decay}")
        if not 0.0 <= self.explore_fraction < 1.0:
            raise ValueError(f"explore_fraction must be in [0, 1), got {self.explore_fraction}")
        for name in ("prior_weight", "cost_half_life_s", "period_s", "hold_s", "exploration_bonus"):
            if getattr(self, name) <= 0.0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.min_rounds < 1:
            raise ValueError(f"min_rounds must be at least 1, got {self.min_rounds}")
