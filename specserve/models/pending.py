"""What every kind of cached sequence shares: token ids of which the first `num_cached` have KV entries."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class PendingTokens(ABC):
    """Tokens 0..num_cached-1 are in the KV cache; the rest are pending until the next feed()."""

    token_ids: list[int]
    num_cached: int

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_cached

    @abstractmethod
    def feed(self, num_logits: int, upto: int | None = None) -> torch.Tensor:
        """Run the pending tokens (through `upto`) in one pass; logits [num_logits, vocab] of the last ones."""

    def prefill(self, max_tokens: int | None = None, num_left: int = 1) -> bool:
        """Cache the prompt but its last `num_left` tokens (the first round feeds those), at most `max_tokens`
        per call; True once done. In chunks, a long prompt lets other sessions' passes run in between."""
        end = len(self.token_ids) - num_left
        if max_tokens is not None:
            end = min(end, self.num_cached + max_tokens)
        if end > self.num_cached:
            self.feed(1, upto=end)
        return self.num_cached >= len(self.token_ids) - num_left
