"""The speculative-decoding algorithm: pure Python + torch, no transport, no model library."""

from specserve.core.loop import GenerationResult, speculative_generate
from specserve.core.stats import SpeculationStats
from specserve.core.types import Drafter, Proposal, SamplingParams, Verdict, Verifier
from specserve.core.verify import greedy_verify, rejection_sample

__all__ = [
    "Drafter",
    "GenerationResult",
    "Proposal",
    "SamplingParams",
    "SpeculationStats",
    "Verdict",
    "Verifier",
    "greedy_verify",
    "rejection_sample",
    "speculative_generate",
]
