"""The lean single-sequence pass (models/lean.py) gives transformers' logits bit for bit, cache included, with
specserve's few-query attention (the CPU default) and with transformers' SDPA."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specserve.models.lean import LeanDecoder, unsupported_reason
from specserve.models.loading import LoadedModel, ModelConfig, load_model
from specserve.models.sequence import CachedSequence

PROMPT = list(b"def fibonacci(n):\n    if n < 2:\n        return n\n")
LOADS = {
    "float32": ModelConfig("tiny", device="cpu", dtype="float32"),
    "bfloat16": ModelConfig("tiny", device="cpu", dtype="bfloat16"),
    "bfloat16, SDPA": ModelConfig("tiny", device="cpu", dtype="bfloat16", few_query_attention=False),
    "float32, SDPA": ModelConfig("tiny", device="cpu", dtype="float32", few_query_attention=False),
    "int8 draft": ModelConfig("tiny-draft", device="cpu", quantization="int8"),
    "int4 draft": ModelConfig("tiny-draft", device="cpu", quantization="int4"),
}


@pytest.fixture(scope="module", params=sorted(LOADS))
def loaded(request: pytest.FixtureRequest) -> LoadedModel:
    return load_model(LOADS[request.param], progress=False)


def _session(sequence: CachedSequence) -> list[torch.Tensor]:
    """Prefill in chunks, decode steps, a verification window, a rollback into it, and decoding on."""
    rows = []
    while not sequence.prefill(max_tokens=16):
        pass
    for _ in range(6):
        rows.append(sequence.feed(1))
        sequence.token_ids.append(int(rows[-1][-1].argmax()))
    sequence.token_ids += [101, 102, 103, 104]
    rows.append(sequence.feed(5))  # the pending token plus a window of four
    sequence.truncate(len(sequence.token_ids) - 3)
    sequence.token_ids.append(7)
    for _ in range(4):
        rows.append(sequence.feed(2 if sequence.num_pending > 1 else 1))
        sequence.token_ids.append(int(rows[-1][-1].argmax()))
    return rows


def test_lean_pass_is_bit_identical_to_transformers(loaded: LoadedModel) -> None:
    assert loaded.decoder is not None
    reference = _session(CachedSequence(loaded.model, PROMPT))
    lean_sequence = CachedSequence(loaded.model, PROMPT, loaded.decoder)
    lean = _session(lean_sequence)
    assert len(lean) == len(reference)
    for expected, got in zip(reference, lean):
        assert torch.equal(expected, got)
    assert lean_sequence.cache.get_seq_length() == lean_sequence.num_cached


def _tiny_qwen2(**overrides: object) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, **overrides)  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_models_the_lean_pass_would_change_are_left_to_transformers() -> None:
    assert unsupported_reason(_tiny_qwen2()) is None
    eager = _tiny_qwen2()
    eager.config._attn_implementation = "eager"
    assert "attention" in (unsupported_reason(eager) or "")
    scaled = _tiny_qwen2(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert "rope" in (unsupported_reason(scaled) or "")
    sliding = _tiny_qwen2(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert "sliding" in (unsupported_reason(sliding) or "")
    with pytest.raises(ValueError, match="does not support"):
        LeanDecoder(eager)
