"""Attention for passes over few positions on the CPU (decode steps, verification windows, draft steps): the
query heads that share a key/value head packed into the query length, so torch's fused kernel reads each
key/value head once. Registered with transformers as ATTENTION, so batched passes and the lean pass share it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "specserve"
MAX_FEW_QUERIES = 64
"""Passes over more positions than this (prompt chunks) run transformers' SDPA unchanged."""


def few_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, T, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, L, head_dim], L >= T: the cache plus the new positions
    value: torch.Tensor,  # [batch, kv_heads, L, head_dim]
    attention_mask: torch.Tensor | None,  # [batch, 1, T, L] (bool, True: attend; or additive), or None: causal
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' AttentionInterface: returns ([batch, T, heads, head_dim], None).

    Packs the query heads that share a key/value head into the query length, so each key/value head is read
    once, for CPU passes over at most MAX_FEW_QUERIES positions; anything else goes to transformers' SDPA.
    Why: docs/architecture.md, "CPU passes"."""
    batch, num_heads, num_queries, head_dim = query.shape
    if query.device.type != "cpu" or num_queries > MAX_FEW_QUERIES or dropout > 0.0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    num_kv_heads, length = key.shape[1], key.shape[2]
    groups = num_heads // num_kv_heads
    packed = query.reshape(batch, num_kv_heads, groups * num_queries, head_dim)  # row g * T + t: head g, query t
    mask = _packed_mask(attention_mask, groups, num_queries, length, query.device)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.view(batch, num_heads, num_queries, head_dim).transpose(1, 2).contiguous(), None


def _packed_mask(
    attention_mask: torch.Tensor | None, groups: int, num_queries: int, length: int, device: torch.device
) -> torch.Tensor | None:
    """The mask of each packed row, [batch or 1, 1, groups * T, L]; None when every row sees every key."""
    if attention_mask is None:
        if num_queries == 1:
            return None
        # causal, the queries being the last T positions: query t sees keys 0 .. L - T + t
        positions = torch.arange(length, device=device)
        attention_mask = (positions <= torch.arange(length - num_queries, length, device=device)[:, None])[None, None]
    elif num_queries == 1:  # one mask row serves every packed row
        return attention_mask
    batch = attention_mask.shape[0]
    rows = attention_mask.expand(batch, 1, num_queries, length)[:, :, None]  # [batch, 1, 1, T, L]
    return rows.expand(batch, 1, groups, num_queries, length).reshape(batch, 1, groups * num_queries, length)


def register() -> None:
    """Make ATTENTION a name transformers knows (idempotent); its masks are SDPA's boolean ones."""
    AttentionInterface.register(ATTENTION, few_query_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


register()
