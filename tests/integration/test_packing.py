"""Prepacked Linear layers (models/packing.py): in bfloat16 exactly what the plain layers compute, in float32
the same to rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.models.loading import ModelConfig, load_model
from specserve.models.packing import PackedLinear, pack_linears, packing_supported
from specserve.models.sequence import CachedSequence

needs_bf16 = pytest.mark.skipif(not packing_supported(), reason="this CPU has no oneDNN bfloat16 support")


@needs_bf16
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (7, 96), (2, 5, 96)])
def test_packed_linear_is_bit_identical(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(shape).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(PackedLinear(linear)(x), linear(x))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (7, 96), (2, 5, 96)])
def test_a_packed_float32_linear_agrees_to_rounding(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        expected, got = linear(x), PackedLinear(linear)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_and_float32_linears_are_packed_nothing_else() -> None:
    bf16, fp32, fp16 = nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 8), nn.Linear(8, 8).to(torch.float16)
    model = nn.Sequential(bf16, fp32, fp16, nn.Embedding(4, 8))
    bf16_packed = packing_supported(torch.bfloat16)
    assert pack_linears(model) == 1 + bf16_packed
    expected_bf16 = PackedLinear if bf16_packed else nn.Linear
    assert [type(m) for m in model] == [expected_bf16, PackedLinear, nn.Linear, nn.Embedding]


def test_a_layer_the_packed_kernel_computes_differently_stays_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = lambda x, weight, bias, *args: torch.zeros(*x.shape[:-1], 8)  # noqa: E731
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", wrong)
    model = nn.Sequential(nn.Linear(8, 8))
    assert pack_linears(model) == 0
    assert type(model[0]) is nn.Linear


def test_a_packed_float32_model_decodes_as_the_plain_one() -> None:
    """The tiny models' logits to rounding, and greedy speculation over packed models emits what target-only
    decoding over plain ones does."""
    plain = load_model(ModelConfig("tiny", device="cpu", pack_weights=False), progress=False)
    packed = load_model(ModelConfig("tiny", device="cpu"), progress=False)
    assert packed.dtype == torch.float32
    assert sum(isinstance(m, PackedLinear) for m in packed.model.modules()) == 7 * 2 + 1  # per layer, lm_head
    prompt = list(PROMPTS[0].encode())
    for expected, got in zip(_logits(plain.model, prompt, 12), _logits(packed.model, prompt, 12), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    draft = load_model(ModelConfig("tiny-draft", device="cpu"), progress=False)
    speculative, target_only = SpeculativeEngine(packed, draft), SpeculativeEngine(plain, draft)
    for prompt_text in PROMPTS:
        request = GenerationRequest(prompt=prompt_text, max_tokens=40, ignore_eos=True)
        plain_request = GenerationRequest(prompt=prompt_text, max_tokens=40, ignore_eos=True, num_speculative_tokens=0)
        result = speculative.generate(request)
        assert result.stats.num_accepted > 0
        assert result.token_ids == target_only.generate(plain_request).token_ids


def _logits(model: nn.Module, prompt: list[int], steps: int) -> list[torch.Tensor]:
    sequence = CachedSequence(model, prompt)
    sequence.prefill()
    rows = []
    for _ in range(steps):
        logits = sequence.feed(1)[-1]
        rows.append(logits)
        sequence.token_ids.append(int(logits.argmax()))
    sequence.token_ids += [5, 6, 7]  # a verification window: several positions in one pass
    return [*rows, sequence.feed(3)]


@needs_bf16
def test_a_packed_model_gives_the_plain_models_logits() -> None:
    plain = load_model(ModelConfig("tiny", device="cpu", dtype="bfloat16", pack_weights=False), progress=False)
    packed = load_model(ModelConfig("tiny", device="cpu", dtype="bfloat16"), progress=False)
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.model.modules()) == 7 * 2 + 1  # per layer, lm_head
    prompt = list(PROMPTS[0].encode())
    for expected, got in zip(_logits(plain.model, prompt, 12), _logits(packed.model, prompt, 12), strict=True):
        assert torch.equal(expected, got)


@needs_bf16
def test_speculation_over_packed_models_changes_nothing() -> None:
    """Same tokens and the same acceptance, round by round, as over the plain models."""
    outputs = []
    for pack in (False, True):
        target = load_model(ModelConfig("tiny", device="cpu", dtype="bfloat16", pack_weights=pack), progress=False)
        draft = load_model(ModelConfig("tiny-draft", device="cpu", dtype="bfloat16", pack_weights=pack), progress=False)
        engine = SpeculativeEngine(target, draft)
        results = [engine.generate(GenerationRequest(prompt=p, max_tokens=40, ignore_eos=True)) for p in PROMPTS]
        outputs.append([(r.token_ids, r.stats.num_accepted, r.stats.num_rounds) for r in results])
    assert outputs[0] == outputs[1]
    assert all(num_accepted > 0 for _, num_accepted, _ in outputs[1])


PROMPTS = ("def add(a, b):", "The quick brown fox")
