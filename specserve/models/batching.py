"""One forward pass over the pending tokens of many growing caches, each with its own length.

The caches are left-padded into one batch (padding masked out), the new tokens right-padded; after the
pass each sequence takes back only its own new cache entries. ModelRunner.feed chooses this pass.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specserve.models.pass_clock import model_pass
from specserve.models.sequence import CachedSequence


def paddable(sequence: object) -> bool:
    """A growing cache with entries in every layer (a pool slot's sequence has none: it is fed alone)."""
    return (
        isinstance(sequence, CachedSequence)
        and sequence.num_cached > 0
        and all(layer.is_initialized for layer in sequence.cache.layers)
    )


def feed_padded(sequences: list[CachedSequence], num_logits: list[int]) -> list[torch.Tensor]:
    """Feed every sequence's pending tokens in one pass (under inference mode); logits [num_logits[i], vocab]
    per sequence."""
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
