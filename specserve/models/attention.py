"""Attention for passes over few positions on the CPU: decode steps, verification windows, draft steps.

torch's fused CPU attention (SDPA) is slow for one query against a long cache, in bfloat16 above all: the
1.5B target's shapes, one query, 300 / 1,000 / 4,000 cached tokens, 0.4-0.8 / 1.3-2.5 / 5.2 ms a layer
against 0.11 / 0.17 / 0.24 ms as two matrix products around a float32 softmax, transformers' "eager"
arithmetic (docs/benchmarks.md, "Attention for few queries"). Over many queries (prompt chunks) the fused
kernel wins, and on GPUs it always does: those passes keep transformers' SDPA.

Registered with transformers as the attention implementation ATTENTION, so batched passes through
transformers and the lean single-sequence pass (models/lean.py) run the same function.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "specserve"
MAX_FEW_QUERIES = 64
"""Passes over more positions than this (prompt chunks) run SDPA, faster there (measured: 256 queries
against 4,096 cached tokens, 64 ms SDPA against 89 ms; 16 queries, 7.1 against 2.4 ms)."""


def few_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, T, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, L, head_dim], L >= T: the cache plus the new positions
    value: torch.Tensor,  # [batch, kv_heads, L, head_dim]
    attention_mask: torch.Tensor | None,  # [batch, 1, T, L] bool (True: attend), or None: causal
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' AttentionInterface: returns ([batch, T, heads, head_dim], None)."""
    batch, num_heads, num_queries, head_dim = query.shape
    if query.device.type != "cpu" or num_queries > MAX_FEW_QUERIES or dropout > 0.0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    num_kv_heads, length = key.shape[1], key.shape[2]
    groups = num_heads // num_kv_heads
    scaling = head_dim**-0.5 if scaling is None else scaling
    # the query heads that share a key/value head are rows of one product: no copies of the cache per head
    grouped = query.reshape(batch, num_kv_heads, groups * num_queries, head_dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)).float().mul_(scaling)  # [batch, kv, groups * T, L]
    scores = scores.view(batch, num_kv_heads, groups, num_queries, length)
    masked_out = _masked_out(attention_mask, num_queries, length, query.device)
    if masked_out is not None:  # the smallest float, not -inf: a row with nothing to attend gives no NaN
        scores.masked_fill_(masked_out, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, num_kv_heads, groups * num_queries, length)
    out = torch.matmul(probs, value).view(batch, num_heads, num_queries, head_dim)
    return out.transpose(1, 2).contiguous(), None


def _masked_out(
    attention_mask: torch.Tensor | None, num_queries: int, length: int, device: torch.device
) -> torch.Tensor | None:
    """Where scores are masked out, broadcastable to [batch, kv, groups, T, L]; None when nothing is."""
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:  # an additive float mask: 0 attends
            attention_mask = attention_mask == 0
        return ~attention_mask[:, :, None]  # [batch, 1, 1, T, L]
    if num_queries == 1:
        return None
    # causal, the queries being the last T positions: query i sees keys 0 .. L - T + i
    positions = torch.arange(length, device=device)
    return positions > torch.arange(length - num_queries, length, device=device)[:, None]  # [T, L]


def register() -> None:
    """Make ATTENTION a name transformers knows (idempotent); its masks are SDPA's boolean ones."""
    AttentionInterface.register(ATTENTION, few_query_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


register()
