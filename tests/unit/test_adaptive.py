"""The adaptive policy's parts through their public contracts: acceptance per window position, measured
costs and the verify cost by window length, the config's validation. Its choices are judged by outcome in
test_adaptive_outcomes.py."""

from __future__ import annotations

import pytest

from specserve.adaptive import AcceptanceModel, AdaptiveConfig, AdaptivePolicy, batch_bucket, tokens_per_round
from specserve.adaptive.cost import BucketCosts, CostModel, DecayedMean
from specserve.bench.adaptive_replay import Landscape, ReplayConfig, StepCosts, replay


def test_expected_tokens_count_the_bonus_token() -> None:
    assert tokens_per_round([]) == 1.0
    assert tokens_per_round([0.5, 0.5]) == pytest.approx(1.75)


def test_a_draft_equal_to_the_target_reaches_k_plus_one_and_a_random_one_about_one() -> None:
    same, random = AcceptanceModel(), AcceptanceModel()
    for _ in range(200):
        same.observe(num_accepted=4, num_drafted=4)
        random.observe(num_accepted=0, num_drafted=4)
    assert same.expected_tokens(4) == pytest.approx(5.0, abs=0.1)
    assert random.expected_tokens(4) == pytest.approx(1.0, abs=0.05)


def test_only_positions_up_to_the_first_rejection_are_examined() -> None:
    model = AcceptanceModel()
    for _ in range(100):
        model.observe(num_accepted=1, num_drafted=4)
    first, second, third, fourth = model.rates(4)
    assert first == pytest.approx(1.0, abs=0.05) and second == pytest.approx(0.0, abs=0.05)
    assert third == fourth == second  # never reached: the figure of the position before


def test_a_window_the_draft_ended_early_counts_as_a_rejection_where_it_ended() -> None:
    model = AcceptanceModel()
    for _ in range(100):
        model.observe(num_accepted=2, num_drafted=2, stopped_early=True)
    assert model.rates(3)[:2] == pytest.approx([1.0, 1.0], abs=0.05)
    assert model.rates(3)[2] == pytest.approx(0.0, abs=0.05)


def test_a_deep_position_keeps_its_figure_while_windows_stay_short() -> None:
    model = AcceptanceModel()
    for _ in range(100):
        model.observe(num_accepted=4, num_drafted=4)
    deep = model.rates(4)[3]
    for _ in range(500):
        model.observe(num_accepted=1, num_drafted=1)
    assert model.rates(4)[3] == pytest.approx(deep)


def test_a_decayed_mean_halves_its_weight_every_half_life() -> None:
    mean = DecayedMean(half_life_s=10.0)
    for value in (1.0, 3.0):
        mean.observe(value, now=0.0)
    assert mean.mean == pytest.approx(2.0) and mean.weight(20.0) == pytest.approx(0.5)
    assert DecayedMean(10.0).relative_error(0.0) == float("inf")


def test_the_verify_cost_follows_the_window_length_between_and_beyond_measured_lengths() -> None:
    costs = BucketCosts(half_life_s=30.0)
    assert costs.verify_seconds(3) is None
    for length, seconds in ((1, 0.033), (2, 0.047)):
        costs.mean(costs.verify_s, length).observe(seconds, now=0.0)
    assert costs.verify_seconds(5) == pytest.approx(0.033 + 4 * 0.014)  # along the slope of the last two
    costs.mean(costs.verify_s, 8).observe(0.160, now=0.0)
    assert costs.verify_seconds(5) == pytest.approx(0.047 + 3 * (0.160 - 0.047) / 6)


def test_a_round_is_modelled_as_draft_steps_plus_a_verify_scaled_to_the_measured_rounds() -> None:
    costs = BucketCosts(half_life_s=30.0)
    for length, seconds in ((1, 0.03), (5, 0.07)):
        costs.mean(costs.verify_s, length).observe(seconds, now=0.0)
    costs.draft_step_s = DecayedMean(30.0)
    costs.draft_step_s.observe(0.01, now=0.0)
    assert costs.modelled_round_s(2) == pytest.approx(0.02 + 0.05)
    costs.mean(costs.round_s, 4).observe(2 * (0.04 + 0.07), now=0.0)  # rounds take twice the calls' time
    assert costs.modelled_round_s(2) == pytest.approx(2 * (0.02 + 0.05))


def test_prefill_stalls_are_priced_per_token_and_dearer_while_speculating() -> None:
    """Stalls pooled over k, 0.1 s a token; prefills with a draft's beside take 1.5x as long, and half of
    the prefills had one: speculation pays 1.2x the pooled figure, target-only 0.8x."""
    costs = CostModel()
    assert costs.stall_per_token(8, speculating=True, now=0.0) == 0.0  # nothing measured
    for i in range(100):
        costs.observe_stall(8, stalled_s=0.2, num_tokens=2, now=0.0)
        costs.observe_target_prefill(1.5 if i % 2 else 1.0, 100, beside_draft=bool(i % 2), alone=True, now=0.0)
    assert costs.stall_per_token(8, speculating=True, now=0.0) == pytest.approx(0.12)
    assert costs.stall_per_token(8, speculating=False, now=0.0) == pytest.approx(0.08)
    assert costs.stall_per_token(16, speculating=False, now=0.0) == pytest.approx(0.08)  # the nearest bucket's


def test_batch_buckets_group_nearby_sizes() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 6, 11, 12, 16, 22)] == [0, 1, 2, 2, 2, 3, 3, 4, 4, 4]


def test_a_fresh_policy_drafts_its_initial_k() -> None:
    policy = AdaptivePolicy(AdaptiveConfig(max_k=6, initial_k=3))
    assert policy.k == 3 and policy.choose(batch_size=1, now=0.0) == 3 and policy.max_k == 6


@pytest.mark.parametrize(
    ("field", "value"), [("max_k", 0), ("initial_k", 9), ("prior_acceptance", 1.0), ("hold_s", 0.0), ("min_rounds", 0)]
)
def test_a_bad_config_value_is_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        AdaptiveConfig(**{field: value})


def test_a_change_of_k_is_logged_with_the_figures_it_was_decided_on(caplog: pytest.LogCaptureFixture) -> None:
    landscape = Landscape.from_costs(StepCosts(0.012, {1: 0.033, 2: 0.047, 5: 0.091, 8: 0.160}), [0.8] * 8)
    with caplog.at_level("INFO", logger="specserve.adaptive.policy"):
        replay(landscape, ReplayConfig(seconds_per_load=20.0), seed=0)
    first = caplog.messages[0]
    assert first.startswith("adaptive k 4 -> ") and "tokens/s a session: k=4 " in first, caplog.messages
