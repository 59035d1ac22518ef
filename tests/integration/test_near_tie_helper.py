"""The near-tie check (specserve.bench.lossless, asserted by tests/helpers.py) on the tiny target:
it passes equal outputs, explains nothing it should not, and its reference pass reproduces
target-only greedy decoding, also when one decoder checks many prefixes."""

from __future__ import annotations

import pytest
import torch

from inprocess.engine import SpeculativeEngine
from specserve.bench.lossless import ReferenceDecoder, first_difference, reference_logits
from specserve.config import GenerationRequest
from tests.helpers import assert_divergence_is_near_tie

PROMPT = "def f("


@pytest.fixture(scope="module")
def baseline(engine: SpeculativeEngine) -> tuple[list[int], list[int]]:
    request = GenerationRequest(prompt=PROMPT, max_tokens=12, num_speculative_tokens=0)
    return engine.tokenize(request), engine.generate(request).token_ids


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_reference_pass_reproduces_greedy_decoding(engine: SpeculativeEngine, baseline) -> None:  # type: ignore[no-untyped-def]
    prompt_ids, generated = baseline
    for position in (0, 5, 11):
        logits = reference_logits(engine.target, prompt_ids, generated[:position])
        assert int(logits.argmax()) == generated[position], f"position {position}"


def test_identical_outputs_pass(engine: SpeculativeEngine, baseline) -> None:  # type: ignore[no-untyped-def]
    prompt_ids, generated = baseline
    assert assert_divergence_is_near_tie(engine.target, prompt_ids, generated, list(generated)) is None


def test_a_real_disagreement_fails(engine: SpeculativeEngine, baseline) -> None:  # type: ignore[no-untyped-def]
    prompt_ids, generated = baseline
    logits = reference_logits(engine.target, prompt_ids, generated[:3])
    candidate = generated[:3] + [int(logits.argmin())] + generated[4:]
    with pytest.raises(AssertionError, match="real disagreement at generated position 3"):
        assert_divergence_is_near_tie(engine.target, prompt_ids, generated, candidate)
    divergence = assert_divergence_is_near_tie(engine.target, prompt_ids, generated, candidate, tolerance=1e9)
    assert divergence is not None and divergence.position == 3 and divergence.candidate_gap > 1.0


def test_a_strict_prefix_fails(engine: SpeculativeEngine, baseline) -> None:  # type: ignore[no-untyped-def]
    prompt_ids, generated = baseline
    with pytest.raises(AssertionError, match="strict prefix"):
        assert_divergence_is_near_tie(engine.target, prompt_ids, generated, generated[:-2])


def test_the_reference_decoder_reuses_its_cache_without_changing_a_number(engine: SpeculativeEngine, baseline) -> None:  # type: ignore[no-untyped-def]
    prompt_ids, generated = baseline
    decoder = ReferenceDecoder(engine.target)
    branch = generated[:3] + [(generated[3] + 1) % engine.target.vocab_size]
    for prefix in (generated[:8], generated[:3], branch, generated[:11], [], generated[:8]):  # longer, shorter, apart
        assert torch.equal(decoder.logits(prompt_ids, prefix), reference_logits(engine.target, prompt_ids, prefix))
