"""One forward pass over the pending tokens of many sequences, each with its own KV cache and length.

The caches are left-padded into one batch (padding masked out), the new tokens right-padded; after the
pass each sequence takes back only its own new cache entries. A single sequence takes the unbatched
path, so batch-1 results stay bit-identical to CachedSequence.feed.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specserve.models.llama_cpp import LlamaCppSequence
from specserve.models.pass_clock import model_pass
from specserve.models.sequence import CachedSequence


@torch.inference_mode()
def feed_batch(sequences: list[CachedSequence] | list[LlamaCppSequence], num_logits: list[int]) -> list[torch.Tensor]:
    """Feed every sequence's pending tokens in one pass; logits [num_logits[i], vocab] per sequence."""
    assert len(sequences) == len(num_logits) and sequences
    if isinstance(sequences[0], LlamaCppSequence):
        return sequences[0].model.feed_batch(sequences, num_logits)  # type: ignore[arg-type]
    if len(sequences) == 1 or any(not _is_initialized(s) for s in sequences):
        return [s.feed(n) for s, n in zip(sequences, num_logits)]
    with model_pass():  # the caches' padding and copying back included: this layout's cost of a batch
        return _feed_padded(sequences, num_logits)


def _feed_padded(sequences: list[CachedSequence], num_logits: list[int]) -> list[torch.Tensor]:
    model = sequences[0].model
    device = model.device
    cached = [s.num_cached for s in sequences]
    pending = [s.token_ids[s.num_cached :] for s in sequences]
    num_cached_max, num_new_max = max(cached), max(len(p) for p in pending)
    batch = len(sequences)

    padded = [tokens + [0] * (num_new_max - len(tokens)) for tokens in pending]
    input_ids = torch.tensor(padded, dtype=torch.long, device=device)  # one copy to the device, not one per row
    attention_mask = torch.ones(batch, num_cached_max + num_new_max, dtype=torch.long, device=device)
    position_ids = torch.empty(batch, num_new_max, dtype=torch.long, device=device)
    for i, num_cached in enumerate(cached):
        attention_mask[i, : num_cached_max - num_cached] = 0  # left padding of the cache
        position_ids[i] = torch.arange(num_cached, num_cached + num_new_max, device=device)
    cache = _left_padded_cache(sequences, num_cached_max)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        cache_position=torch.arange(num_cached_max, num_cached_max + num_new_max, device=device),
        use_cache=True,
    )
    logits = []
    for i, (sequence, tokens, n) in enumerate(zip(sequences, pending, num_logits)):
        new = slice(num_cached_max, num_cached_max + len(tokens))
        for layer_idx, layer in enumerate(cache.layers):
            sequence.cache.update(layer.keys[i : i + 1, :, new], layer.values[i : i + 1, :, new], layer_idx)
        sequence.num_cached = len(sequence.token_ids)
        logits.append(out.logits[i, len(tokens) - n : len(tokens)])  # [n, vocab]
    return logits


def _is_initialized(sequence: CachedSequence) -> bool:
    """A growing cache with entries in every layer (a pool slot's sequence has none: it is fed alone)."""
    cache = getattr(sequence, "cache", None)
    return cache is not None and sequence.num_cached > 0 and all(layer.is_initialized for layer in cache.layers)


def _left_padded_cache(sequences: list[CachedSequence], length: int) -> DynamicCache:
    cache = DynamicCache(config=sequences[0].model.config)
    for layer_idx in range(len(sequences[0].cache.layers)):
        keys, values = [], []
        for sequence in sequences:
            layer = sequence.cache.layers[layer_idx]
            pad = length - layer.keys.shape[-2]
            keys.append(torch.nn.functional.pad(layer.keys, (0, 0, pad, 0)))  # [1, heads, length, head_dim]
            values.append(torch.nn.functional.pad(layer.values, (0, 0, pad, 0)))
        cache.update(torch.cat(keys), torch.cat(values), layer_idx)
    return cache
