"""Quantized drafts (models/quantized.py): int4 layers compute close to their float weights, fall back to int8
where the int4 kernel would be slow or cannot run, and a speculative engine on an int4 draft stays lossless."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.models.loading import LoadedModel, ModelConfig, load_model
from specserve.models.quantized import INT4_MAX_ROWS, Int4Linear, int4_supported


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm())


@pytest.mark.parametrize("rows", [1, INT4_MAX_ROWS, INT4_MAX_ROWS + 1, 40])
def test_an_int4_layer_computes_close_to_its_float_weights(rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=True)
    layer = Int4Linear(linear)
    assert layer.packed_weight is not None
    x = torch.randn(rows, 256).to(torch.bfloat16)
    with torch.inference_mode():
        expected, got = linear(x.float()), layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    # int4 in groups of 32: a few per cent; the int8 path (more rows than INT4_MAX_ROWS) under one
    assert _relative_error(got, expected) < (0.12 if rows <= INT4_MAX_ROWS else 0.02)


def test_few_rows_run_int4_and_more_rows_int8() -> None:
    torch.manual_seed(1)
    layer = Int4Linear(nn.Linear(64, 32, bias=False))
    x = torch.randn(INT4_MAX_ROWS + 1, 64).to(torch.bfloat16)
    with torch.inference_mode():
        one_by_one = torch.cat([layer(row[None]) for row in x])  # int4, a row at a time
        int8 = layer.int8(x.float()).to(torch.bfloat16)
        assert torch.equal(layer(x), int8)  # all rows at once: the int8 weights
        assert not torch.equal(one_by_one, int8)  # the two weight sets really differ


def test_a_shape_the_int4_kernel_does_not_take_runs_int8() -> None:
    layer = Int4Linear(nn.Linear(64, 260))  # 260 outputs: the kernel wants a multiple of 16
    assert layer.packed_weight is None
    x = torch.randn(1, 64)
    with torch.inference_mode():
        assert torch.equal(layer(x), layer.int8(x))


@pytest.fixture(scope="module")
def int4_draft() -> LoadedModel:
    return load_model(ModelConfig("tiny-draft", device="cpu", quantization="int4"), progress=False)


def test_an_int4_draft_loads_every_layer_it_can_as_int4(int4_draft: LoadedModel) -> None:
    layers = [m for m in int4_draft.model.modules() if isinstance(m, Int4Linear)]
    assert not any(type(m) is nn.Linear for m in int4_draft.model.modules())
    assert [m.out_features for m in layers if m.packed_weight is None] == [260]  # only the byte-vocabulary head
    assert int4_draft.dtype == torch.float32  # tiny presets stay float32 unless a dtype is asked for


@pytest.mark.parametrize("k", [2, 4, 8])
def test_greedy_output_with_an_int4_draft_equals_target_only(
    tiny_target: LoadedModel, int4_draft: LoadedModel, k: int
) -> None:
    engine = SpeculativeEngine(tiny_target, int4_draft)
    for prompt in ("def f(", "hello world", "for i in range(10):\n"):
        request = GenerationRequest(prompt=prompt, max_tokens=40, num_speculative_tokens=k)
        expected = engine.generate(GenerationRequest(prompt=prompt, max_tokens=40, num_speculative_tokens=0))
        result = engine.generate(request)
        assert result.token_ids == expected.token_ids
        assert result.stats.num_accepted > 0  # the int4 draft still proposes what the target says


def test_auto_quantization_picks_int4_on_avx512_cpus() -> None:
    cpu = torch.device("cpu")
    assert ModelConfig("x", quantization="auto").resolve_quantization(cpu) == ("int4" if int4_supported() else "int8")
    assert ModelConfig("x", quantization="auto").resolve_quantization(torch.device("cuda")) == "none"
    with pytest.raises(ValueError, match="int4 runs on the CPU only"):
        from specserve.models.quantized import quantize_int4

        quantize_int4(nn.Linear(32, 32), torch.device("cuda"))


def test_the_bench_labels_an_int4_draft_as_such(int4_draft: LoadedModel) -> None:
    from specserve.models.quantized import quantization_label

    assert quantization_label(int4_draft.model) == "int4 + int8 (dynamic) for longer passes"
    assert quantization_label(nn.Sequential(nn.Linear(4, 4))) is None


def test_a_bfloat16_int4_draft_serves_greedy_and_sampled_requests(tiny_target: LoadedModel) -> None:
    """The real draft's setting: bfloat16 activations around the int4 layers (tiny presets default to float32)."""
    from specserve.core.types import SamplingParams

    draft = load_model(ModelConfig("tiny-draft", device="cpu", dtype="bfloat16", quantization="int4"), progress=False)
    assert draft.dtype == torch.bfloat16
    engine = SpeculativeEngine(tiny_target, draft)
    greedy = engine.generate(GenerationRequest(prompt="def f(", max_tokens=32, num_speculative_tokens=4))
    expected = engine.generate(GenerationRequest(prompt="def f(", max_tokens=32, num_speculative_tokens=0))
    assert greedy.token_ids == expected.token_ids and greedy.stats.num_accepted > 0
    sampling = SamplingParams(temperature=0.7, seed=3)
    request = GenerationRequest(
        prompt="def f(", max_tokens=32, num_speculative_tokens=4, sampling=sampling, ignore_eos=True
    )
    first, again = engine.generate(request), engine.generate(request)
    assert len(first.token_ids) == 32 and first.token_ids == again.token_ids  # seeded: reproducible
    assert first.stats.num_accepted > 0
