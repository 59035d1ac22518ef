"""The speculative-decoding algorithm: pure Python + torch, no transport, no model library."""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use: clients import specserve.core.types (SamplingParams) without torch.
_EXPORTS = {
    "Drafter": "types",
    "GenerationResult": "loop",
    "Proposal": "types",
    "SamplingParams": "types",
    "SpeculationStats": "stats",
    "Verdict": "types",
    "Verifier": "types",
    "greedy_verify": "verify",
    "rejection_sample": "verify",
    "speculative_generate": "loop",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"specserve.core.{_EXPORTS[name]}"), name)
