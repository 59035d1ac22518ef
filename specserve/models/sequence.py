"""One token sequence and its KV cache on one model: feed new tokens, truncate on rejection."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specserve.models.lean import LeanDecoder
from specserve.models.loading import LoadedModel
from specserve.models.pass_clock import model_pass
from specserve.models.pending import PendingTokens


def check_token_ids(token_ids: list[int], loaded: LoadedModel, field: str) -> None:
    """Raise ValueError naming the field when an id is outside the model's vocabulary."""
    bad = [t for t in token_ids if not 0 <= t < loaded.vocab_size]
    if bad:
        raise ValueError(f"{field}: token ids must be in [0, {loaded.vocab_size}), got {bad[:5]}")


def check_prompt(token_ids: list[int], loaded: LoadedModel) -> None:
    """Raise ValueError unless the prompt has 1..max_context ids, all in the vocabulary. Checked before any
    pass: a pass over a prompt far past the context would hold the model for minutes."""
    if not 1 <= len(token_ids) <= loaded.max_context:
        raise ValueError(f"prompt_token_ids: a prompt has 1 to {loaded.max_context} tokens, got {len(token_ids)}")
    check_token_ids(token_ids, loaded, "prompt_token_ids")


class CachedSequence(PendingTokens):
    """Tokens 0..num_cached-1 are in the KV cache (a growing DynamicCache); the rest are pending."""

    def __init__(self, model: PreTrainedModel, token_ids: list[int], decoder: LeanDecoder | None = None) -> None:
        self.model = model
        self.decoder = decoder  # the same pass as model(...) with less framework per call; None: model(...)
        self.token_ids = list(token_ids)
        self.cache = DynamicCache(config=model.config)
        self.num_cached = 0

    @torch.inference_mode()
    def feed(self, num_logits: int, upto: int | None = None) -> torch.Tensor:
        """Run the pending tokens (through `upto`) in one pass; return logits [num_logits, vocab] of the last ones."""
        end = len(self.token_ids) if upto is None else upto
        assert self.num_cached < end <= len(self.token_ids), (self.num_cached, end, len(self.token_ids))
        assert 0 < num_logits <= end - self.num_cached
        with model_pass():
            return self._feed(num_logits, end)

    def _feed(self, num_logits: int, end: int) -> torch.Tensor:
        if self.decoder is not None:
            new_token_ids = self.token_ids[self.num_cached : end]
            logits = self.decoder.forward(new_token_ids, self.num_cached, self.cache, num_logits)
            self.num_cached = end
            return logits
        device = self.model.device
        input_ids = torch.tensor([self.token_ids[self.num_cached : end]], dtype=torch.long, device=device)
        cache_position = torch.arange(self.num_cached, end, device=device)
        out = self.model(
            input_ids=input_ids,
            cache=self.cache,
            cache_position=cache_position,
            use_cache=True,
            logits_to_keep=num_logits,
        )
        self.num_cached = end
        return out.logits[0]  # [num_logits, vocab]

    def truncate(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens: the one call that rolls back rejected positions."""
        assert 0 <= num_tokens <= len(self.token_ids)
        del self.token_ids[num_tokens:]
        if self.num_cached > num_tokens:
            self.cache.crop(num_tokens - self.num_cached)  # transformers 5: a negative count removes
            self.num_cached = num_tokens
