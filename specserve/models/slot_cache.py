"""KV caches in one preallocated pool, one slot per session, so that a batched one-token draft step has fixed
shapes and can be replayed as a CUDA graph (models/step_graphs.py). The graphed batched step is the draft's
only: its attention over a padded slot rounds differently, which a draft may. A target's sessions may sit in
a pool too (TargetWorker's slot_cache), fed one at a time by the lean pass, which gives the growing cache's
numbers exactly (docs/architecture.md)."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specserve.models.lean import LeanDecoder
from specserve.models.pass_clock import model_pass
from specserve.models.pending import PendingTokens
from specserve.models.sequence import CachedSequence


@dataclass(frozen=True, slots=True)
class SlotCacheConfig:
    """The draft's preallocated KV cache pool and its graphed steps."""

    enabled: bool | None = None
    """None: on CUDA only, where launching each kernel from Python dominates a small model's step."""
    slots: int = 64
    """Sessions held in the pool at once; the rest keep a growing cache each (the slower path)."""
    tokens_per_slot: int = 4096
    """Context one slot holds; a session that grows past it moves to a growing cache."""
    cuda_graphs: bool = True
    """Replay each batched draft step as a CUDA graph (captured per batch and length bucket on first use)."""

    def __post_init__(self) -> None:
        if self.slots < 1 or self.tokens_per_slot < 1:
            raise ValueError(f"slots and tokens_per_slot must be >= 1, got {self.slots}, {self.tokens_per_slot}")

    def active_on(self, device: torch.device) -> bool:
        return self.enabled if self.enabled is not None else device.type == "cuda"


class SlotPool:
    """keys[layer] / values[layer]: [slots + 1, tokens_per_slot, kv_heads, head_dim]; the last slot is scratch,
    written by the padding rows of a batched step."""

    def __init__(self, model: PreTrainedModel, config: SlotCacheConfig) -> None:
        text = model.config
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        shape = (config.slots + 1, config.tokens_per_slot, text.num_key_value_heads, head_dim)
        layers = text.num_hidden_layers
        self.keys = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(layers)]
        self.tokens_per_slot = config.tokens_per_slot
        self.scratch = config.slots
        self._free = list(range(config.slots - 1, -1, -1))
        self._lock = threading.Lock()  # sessions are opened on gRPC threads and dropped anywhere

    def acquire(self) -> int | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    @property
    def num_free(self) -> int:
        return len(self._free)


class SlotView:
    """What LeanDecoder needs of a cache, over one slot: `update` writes the new positions and returns the
    slot's keys and values through them ([1, kv_heads, start + T, head_dim])."""

    def __init__(self, pool: SlotPool, slot: int, start: int) -> None:
        self.pool, self.slot, self.start = pool, slot, start

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.start + key.shape[2]
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        keys[self.slot, self.start : end] = key[0].transpose(0, 1)
        values[self.slot, self.start : end] = value[0].transpose(0, 1)
        return keys[self.slot, :end].transpose(0, 1)[None], values[self.slot, :end].transpose(0, 1)[None]


class SlotSequence(PendingTokens):
    """CachedSequence's interface (token_ids, num_cached, prefill, feed, truncate) over one pool slot. Passes
    over several tokens (prompt chunks) run the lean decoder into the slot; one-token steps of many sessions
    run batched in StepGraphs. The slot returns to the pool when the sequence is released or dropped."""

    def __init__(self, model: PreTrainedModel, token_ids: list[int], decoder: LeanDecoder, pool: SlotPool, slot: int):
        self.model, self.decoder, self.pool, self.slot = model, decoder, pool, slot
        self.token_ids = list(token_ids)
        self.num_cached = 0
        self._finalizer = weakref.finalize(self, pool.free, slot)

    def fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.pool.tokens_per_slot

    @torch.inference_mode()
    def feed(self, num_logits: int, upto: int | None = None) -> torch.Tensor:
        """Run the pending tokens (through `upto`) in one pass; logits [num_logits, vocab] of the last ones."""
        end = len(self.token_ids) if upto is None else upto
        assert self.num_cached < end <= len(self.token_ids) and self.fits(end), (self.num_cached, end)
        view = SlotView(self.pool, self.slot, self.num_cached)
        with model_pass():
            tokens = self.token_ids[self.num_cached : end]
            logits = self.decoder.forward(tokens, self.num_cached, view, num_logits)  # type: ignore[arg-type]
        self.num_cached = end
        return logits

    def truncate(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens; later positions of the slot are masked until overwritten."""
        assert 0 <= num_tokens <= len(self.token_ids)
        del self.token_ids[num_tokens:]
        self.num_cached = min(self.num_cached, num_tokens)

    def release(self) -> None:
        self._finalizer()  # returns the slot once

    def to_growing(self) -> CachedSequence:
        """The same sequence with its cache copied out of the slot into a growing one; the slot is freed."""
        sequence = CachedSequence(self.model, self.token_ids, self.decoder)
        if self.num_cached:
            cache: DynamicCache = sequence.cache
            for layer_idx, (keys, values) in enumerate(zip(self.pool.keys, self.pool.values)):
                cache.update(
                    keys[self.slot, : self.num_cached].transpose(0, 1)[None].clone(),
                    values[self.slot, : self.num_cached].transpose(0, 1)[None].clone(),
                    layer_idx,
                )
            sequence.num_cached = self.num_cached
        self.release()
        return sequence
