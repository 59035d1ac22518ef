"""Adaptive speculation length: per target replica, the k (0 = target-only) with the most expected tokens
per second, from measured acceptance and costs. It picks k only; verification stays in specserve.core."""

from specserve.adaptive.acceptance import AcceptanceModel, tokens_per_round
from specserve.adaptive.config import AdaptiveConfig
from specserve.adaptive.cost import CostModel, batch_bucket
from specserve.adaptive.policy import AdaptivePolicy, Estimate

__all__ = [
    "AcceptanceModel",
    "AdaptiveConfig",
    "AdaptivePolicy",
    "CostModel",
    "Estimate",
    "batch_bucket",
    "tokens_per_round",
]
