"""Prompt lookup and the hybrid in process: sampled output keeps the target's joint distribution (one-hot
lookup drafts through the exact rejection rule), and the hybrid's model cache stays right across lookup rounds.
The statistical pattern is that of test_sampling_lossless.py, on a prompt that repeats itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

import target_service.worker
from draft_service.hybrid import HybridConfig, HybridSession, HybridWorker
from draft_service.worker import DraftWorker
from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.core.types import SamplingParams, Verdict
from specserve.models.loading import LoadedModel
from tests.helpers import always_accept, normalize, tv_bound, tv_distance
from tests.helpers import exact_joint as helpers_exact_joint

PROMPT = "def f(x, def f(x, def f("  # the suffix "def f(" occurred before: lookup drafts from the first round
SAMPLING = SamplingParams(temperature=1.0, top_k=3)
K = 2
NUM_TOKENS = 3
NUM_RUNS = 3000


@pytest.fixture(scope="module")
def exact_joint(tiny_target: LoadedModel) -> dict[tuple[int, ...], float]:
    """p(t1 | prompt) p(t2 | prompt, t1) p(t3 | prompt, t1, t2) from full forward passes of the target."""
    return helpers_exact_joint(tiny_target, PROMPT, SAMPLING, NUM_TOKENS)


def sampled_joint(engine: SpeculativeEngine, num_runs: int) -> tuple[Counter[tuple[int, ...]], Counter[str]]:
    """Counts of the generated 3-token sequences, and of the drafts proposed by source."""
    counts: Counter[tuple[int, ...]] = Counter()
    sources: Counter[str] = Counter()
    for run in range(num_runs):
        sampling = SamplingParams(temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, seed=run)
        request = GenerationRequest(prompt=PROMPT, max_tokens=NUM_TOKENS, sampling=sampling, num_speculative_tokens=K)
        result = engine.generate(request)
        assert len(result.token_ids) == NUM_TOKENS, result
        counts[tuple(result.token_ids)] += 1
        sources.update(result.stats.proposed_by_source)
    return counts, sources


@pytest.fixture(scope="module", params=["ngram", "tiny-draft+ngram"])
def lookup_engine(
    request: pytest.FixtureRequest, tiny_target: LoadedModel, tiny_draft: LoadedModel
) -> SpeculativeEngine:
    draft = tiny_draft if request.param != "ngram" else None
    return SpeculativeEngine(tiny_target, draft, num_speculative_tokens=K, lookup=True)


def test_sampling_with_lookup_drafts_matches_the_target_joint(
    lookup_engine: SpeculativeEngine, exact_joint: dict[tuple[int, ...], float]
) -> None:
    counts, sources = sampled_joint(lookup_engine, NUM_RUNS)
    assert sources["ngram"] > NUM_RUNS / 2, sources  # lookup drafted most requests' rounds
    if lookup_engine.draft is not None:
        assert sources["model"] > 0, sources  # and the hybrid used its model too
    tv = tv_distance(normalize(counts), exact_joint)
    bound = tv_bound(exact_joint, NUM_RUNS)
    assert tv < bound, f"TV {tv:.4f} of {NUM_RUNS} samples to the target's joint exceeds {bound:.4f}"


@pytest.mark.parametrize("biased", [always_accept])
def test_the_check_has_power_with_lookup_drafts(
    tiny_target: LoadedModel,
    exact_joint: dict[tuple[int, ...], float],
    monkeypatch: pytest.MonkeyPatch,
    biased: Callable[..., Verdict],
) -> None:
    monkeypatch.setattr(target_service.worker, "rejection_sample", biased)
    num_runs = 1500
    counts, _ = sampled_joint(SpeculativeEngine(tiny_target, None, num_speculative_tokens=K, lookup=True), num_runs)
    tv = tv_distance(normalize(counts), exact_joint)
    assert tv > tv_bound(exact_joint, num_runs), f"{biased.__name__} got TV {tv:.4f}: the check has no power"


def test_the_hybrid_model_cache_follows_lookup_rounds(tiny_draft: LoadedModel) -> None:
    """After lookup rounds (their tokens pending for the model, some rolled back), the model drafts exactly
    what a plain draft given the same context drafts."""
    greedy = SamplingParams()
    prompt = [10, 11, 12, 13, 14, 10, 11, 12]
    hybrid, plain = HybridWorker(tiny_draft, config=HybridConfig(min_match=2)), DraftWorker(tiny_draft)
    hybrid.prefill("s", prompt)
    session = hybrid.sessions.get("s")
    assert isinstance(session, HybridSession)
    first = hybrid.propose("s", len(prompt), [], 3, greedy)  # matches "10 11 12": lookup drafts 13 14 10
    assert (first.token_ids, first.source) == ([13, 14, 10], "ngram")
    assert session.sequence.num_pending >= 3  # the model has not seen them yet
    second = hybrid.propose("s", len(prompt) + 1, [99], 3, greedy)  # 13 accepted, then the target's 99: no match
    assert second.source == "model" and second.token_ids
    context = [*prompt, 13, 99]
    plain.prefill("p", context)
    assert plain.propose("p", len(context), [], 3, greedy).token_ids == second.token_ids
    assert session.num_proposed["ngram"] == 3 and session.num_accepted["ngram"] == 1


def test_the_hybrid_tries_lookup_then_leaves_it_once_it_does_worse_than_the_model(tiny_draft: LoadedModel) -> None:
    greedy = SamplingParams()
    hybrid = HybridWorker(tiny_draft, config=HybridConfig(min_match=2, min_relative_acceptance=0.8))
    prompt = [5, 6, 7, 8] * 3
    hybrid.prefill("s", prompt)
    session = hybrid.sessions.get("s")
    assert isinstance(session, HybridSession)
    session.num_proposed["model"], session.num_accepted["model"] = 20.0, 18.0  # the model has done well
    first = hybrid.propose("s", len(prompt), [], 4, greedy)
    assert (first.source, first.token_ids) == ("ngram", [5, 6, 7, 8])  # untried lookup is tried
    second = hybrid.propose("s", len(prompt), [5], 4, greedy)  # all four rejected; "8 5" still matches
    assert second.source == "model", (session.acceptance("ngram"), session.acceptance("model"))
    assert session.acceptance("ngram") < 0.8 * session.acceptance("model")
    for _ in range(40):  # lookup's bad window fades while the model drafts: it is tried again
        kept = len(session.sequence.token_ids) - 1  # the last draft rejected: the model stays near 0.8
        proposal = hybrid.propose("s", kept, [5], 4, greedy)
        if proposal.source == "ngram":
            break
    else:
        pytest.fail("lookup never tried again")
