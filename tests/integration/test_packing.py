"""Prepacked bfloat16 Linear layers (models/packing.py) compute exactly what the plain layers do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specserve.config import GenerationRequest
from specserve.engine import SpeculativeEngine
from specserve.models.loading import ModelConfig, load_model
from specserve.models.packing import PackedLinear, pack_linears, packing_supported
from specserve.models.sequence import CachedSequence

pytestmark = pytest.mark.skipif(not packing_supported(), reason="this CPU has no oneDNN bfloat16 support")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (7, 96), (2, 5, 96)])
def test_packed_linear_is_bit_identical(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(shape).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(PackedLinear(linear)(x), linear(x))


def test_only_bfloat16_linears_are_packed() -> None:
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 8), nn.Embedding(4, 8))
    assert pack_linears(model) == 1
    assert [type(m) for m in model] == [PackedLinear, nn.Linear, nn.Embedding]


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


def test_a_packed_model_gives_the_plain_models_logits() -> None:
    plain = load_model(ModelConfig("tiny", device="cpu", dtype="bfloat16", pack_weights=False), progress=False)
    packed = load_model(ModelConfig("tiny", device="cpu", dtype="bfloat16"), progress=False)
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.model.modules()) == 7 * 2 + 1  # per layer, lm_head
    prompt = list(PROMPTS[0].encode())
    for expected, got in zip(_logits(plain.model, prompt, 12), _logits(packed.model, prompt, 12), strict=True):
        assert torch.equal(expected, got)


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
