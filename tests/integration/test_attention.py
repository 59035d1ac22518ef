"""Few-query attention (models/attention.py) against torch's fused attention, and where it is switched on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specserve.models.attention import ATTENTION, MAX_FEW_QUERIES, few_query_attention
from specserve.models.loading import ModelConfig, load_model


class _Module(torch.nn.Module):
    is_causal = True

    def __init__(self, num_key_value_groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = num_key_value_groups


def _qkv(num_queries: int, length: int, dtype: torch.dtype, batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, 6, num_queries, 16, generator=generator).to(dtype)  # 6 heads over 2 key/value heads
    key = torch.randn(batch, 2, length, 16, generator=generator).to(dtype)
    value = torch.randn(batch, 2, length, 16, generator=generator).to(dtype)
    return query, key, value


def _reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """torch's fused attention in float32, heads repeated; [batch, T, heads, head_dim]."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.float().repeat_interleave(groups, 1), value.float().repeat_interleave(groups, 1)
    out = F.scaled_dot_product_attention(query.float(), key, value, attn_mask=mask, scale=0.25)
    return out.transpose(1, 2)


def _causal(num_queries: int, length: int) -> torch.Tensor:  # [1, 1, T, L], True: attend
    return (torch.arange(length) <= torch.arange(length - num_queries, length)[:, None])[None, None]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("num_queries, length", [(1, 1), (1, 37), (5, 5), (5, 40), (MAX_FEW_QUERIES, 100)])
def test_matches_fused_attention_with_and_without_a_mask(
    dtype: torch.dtype, tolerance: float, num_queries: int, length: int
) -> None:
    query, key, value = _qkv(num_queries, length, dtype)
    expected = _reference(query, key, value, _causal(num_queries, length))
    for mask in (None, _causal(num_queries, length)):  # None: causal over the last T positions
        got, weights = few_query_attention(_Module(3), query, key, value, mask, scaling=0.25)
        assert weights is None and got.dtype == dtype and got.shape == (1, num_queries, 6, 16)
        torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


def test_a_padded_batch_attends_to_what_its_mask_allows() -> None:
    query, key, value = _qkv(3, 12, torch.float32, batch=2)
    mask = _causal(3, 12).repeat(2, 1, 1, 1)
    mask[1, :, :, :4] = False  # the second sequence's cache is left-padded by four positions
    got, _ = few_query_attention(_Module(3), query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(got, _reference(query, key, value, mask), atol=1e-5, rtol=1e-5)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)  # eager's format
    torch.testing.assert_close(few_query_attention(_Module(3), query, key, value, additive, scaling=0.25)[0], got)
    # padding the second sequence differently must change its rows and leave the first one's alone
    mask[1, :, :, 4:6] = False
    moved, _ = few_query_attention(_Module(3), query, key, value, mask, scaling=0.25)
    assert torch.equal(moved[0], got[0]) and not torch.allclose(moved[1], got[1])


def test_a_row_with_nothing_to_attend_gives_no_nan() -> None:
    query, key, value = _qkv(2, 6, torch.float32)
    mask = torch.zeros(1, 1, 2, 6, dtype=torch.bool)
    got, _ = few_query_attention(_Module(3), query, key, value, mask, scaling=0.25)
    assert torch.isfinite(got).all()


def test_many_queries_run_torchs_fused_attention_bit_for_bit() -> None:
    num_queries = MAX_FEW_QUERIES + 1
    query, key, value = _qkv(num_queries, num_queries, torch.float32)
    got, _ = few_query_attention(_Module(3), query, key, value, None, scaling=0.25)
    expected = F.scaled_dot_product_attention(query, key, value, scale=0.25, is_causal=True, enable_gqa=True)
    assert torch.equal(got, expected.transpose(1, 2))


def test_loading_switches_cpu_models_to_it_unless_told_not_to() -> None:
    assert load_model(ModelConfig("tiny", device="cpu"), progress=False).model.config._attn_implementation == ATTENTION
    plain = load_model(ModelConfig("tiny", device="cpu", few_query_attention=False), progress=False)
    assert plain.model.config._attn_implementation == "sdpa"
