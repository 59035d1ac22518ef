"""Sampled speculation reproduces the target's distribution: the joint of the first three tokens.

k = 2 and max_tokens = 3, so one round can emit accepted drafts, a recovered token and the bonus token.
(max_tokens = 2 would not do: the loop shrinks k to leave room for the bonus, making it k = 1.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

import target_service.worker
from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.core.types import SamplingParams, Verdict
from specserve.models.loading import LoadedModel
from tests.helpers import always_accept, normalize, resample_target_on_rejection, tv_bound, tv_distance
from tests.helpers import exact_joint as helpers_exact_joint

PROMPT = "def f("
SAMPLING = SamplingParams(temperature=1.0, top_k=3)  # support of 3 per position: 27 sequences of 3 tokens
K = 2
NUM_TOKENS = 3
NUM_RUNS = 3000


@pytest.fixture(scope="module")
def exact_joint(tiny_target: LoadedModel) -> dict[tuple[int, ...], float]:
    """p(t1 | prompt) p(t2 | prompt, t1) p(t3 | prompt, t1, t2) from full forward passes of the target."""
    return helpers_exact_joint(tiny_target, PROMPT, SAMPLING, NUM_TOKENS)


def sampled_joint(engine: SpeculativeEngine, num_runs: int, k: int) -> Counter[tuple[int, ...]]:
    counts: Counter[tuple[int, ...]] = Counter()
    for run in range(num_runs):
        # seeds map to disjoint draft and target streams (core.verify.make_generator): runs are independent
        sampling = SamplingParams(temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, seed=run)
        request = GenerationRequest(prompt=PROMPT, max_tokens=NUM_TOKENS, sampling=sampling, num_speculative_tokens=k)
        result = engine.generate(request)
        assert len(result.token_ids) == NUM_TOKENS, result  # the tiny target gives no EOS in its top 3 here
        counts[tuple(result.token_ids)] += 1
    return counts


def test_speculative_sampling_matches_the_target_joint(
    engine: SpeculativeEngine, exact_joint: dict[tuple[int, ...], float]
) -> None:
    counts = sampled_joint(engine, NUM_RUNS, K)
    tv = tv_distance(normalize(counts), exact_joint)
    bound = tv_bound(exact_joint, NUM_RUNS)
    assert tv < bound, f"TV {tv:.4f} of {NUM_RUNS} speculative samples to the target's joint exceeds {bound:.4f}"


def _draft_counts(engine: SpeculativeEngine, num_runs: int = 50) -> tuple[int, int]:
    """Drafts proposed over `num_runs` seeded requests, and how many of them sat at window position 2."""
    proposed = second = 0
    for seed in range(num_runs):
        sampling = SamplingParams(temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, seed=seed)
        request = GenerationRequest(prompt=PROMPT, max_tokens=NUM_TOKENS, sampling=sampling, num_speculative_tokens=K)
        stats = engine.generate(request).stats
        proposed += stats.num_proposed
        second += sum(stats.proposed_at_position[1:2])
    return proposed, second


def test_ending_windows_on_low_draft_confidence_keeps_the_target_joint(
    tiny_target: LoadedModel, tiny_draft: LoadedModel, exact_joint: dict[tuple[int, ...], float]
) -> None:
    # the tiny draft's top-3 probabilities straddle 0.4: some windows end after one draft, some run to k
    engine = SpeculativeEngine(tiny_target, tiny_draft, draft_confidence_threshold=0.4)
    with_stop, without_stop = _draft_counts(engine), _draft_counts(SpeculativeEngine(tiny_target, tiny_draft))
    assert with_stop[0] < 0.9 * without_stop[0] and with_stop[1] > 0  # the stop acts, and not on every window
    counts = sampled_joint(engine, NUM_RUNS, K)
    tv = tv_distance(normalize(counts), exact_joint)
    bound = tv_bound(exact_joint, NUM_RUNS)
    assert tv < bound, f"TV {tv:.4f} of {NUM_RUNS} speculative samples to the target's joint exceeds {bound:.4f}"


@pytest.mark.parametrize("biased", [always_accept, resample_target_on_rejection])
def test_the_check_has_power_against_a_biased_sampler(
    engine: SpeculativeEngine,
    exact_joint: dict[tuple[int, ...], float],
    monkeypatch: pytest.MonkeyPatch,
    biased: Callable[..., Verdict],
) -> None:
    monkeypatch.setattr(target_service.worker, "rejection_sample", biased)
    num_runs = 1500  # the biases are large (exact TV ~0.3 and ~0.24 here); half the honest sample shows them
    counts = sampled_joint(engine, num_runs, K)
    tv = tv_distance(normalize(counts), exact_joint)
    bound = tv_bound(exact_joint, num_runs)
    assert tv > bound, f"{biased.__name__} got TV {tv:.4f} within {bound:.4f}: the check has no power"
