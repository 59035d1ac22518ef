"""The adaptive speculation policy: k follows acceptance and costs, and drops to 0 when no k beats
target-only (the rule: never slower than target-only by the measured costs)."""

from __future__ import annotations

import pytest

from specserve.core.adaptive import AdaptiveK, PassCost, SharedAdaptiveK, expected_tokens


def _cost(seconds_at: dict[int, float]) -> PassCost:
    cost = PassCost()
    for _ in range(5):
        for tokens, seconds in seconds_at.items():
            cost.observe(tokens, seconds)
    return cost


def _policy(acceptance: float, draft_step_s: float, max_k: int = 8) -> AdaptiveK:
    """A policy that has seen many rounds at this per-token acceptance and draft step cost."""
    policy = AdaptiveK(max_k, prior_weight=0.0)
    policy.observe(4, 4, draft_step_s * 4)  # sets the draft cost
    policy.num_accepted, policy.num_rejected = 100 * acceptance, 100 * (1 - acceptance)
    return policy


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_pass_cost_fits_a_line() -> None:
    cost = _cost({1: 0.2, 9: 0.2 + 8 * 0.01, 33: 0.2 + 32 * 0.01})
    assert cost.seconds(17) == pytest.approx(0.2 + 16 * 0.01, rel=1e-3)
    assert PassCost().seconds(5) is None


def test_nothing_measured_yet_starts_at_the_initial_k() -> None:
    assert AdaptiveK(6).choose(PassCost(), 1) == 4
    assert AdaptiveK(2).choose(PassCost(), 1) == 2


def test_high_acceptance_and_a_cheap_draft_speculate_deeply() -> None:
    flat = _cost({1: 0.2, 40: 0.21})  # a memory-bound pass: tokens are nearly free
    assert _policy(0.95, draft_step_s=0.01).choose(flat, 1) >= 6


def test_low_acceptance_or_a_costly_draft_backs_off() -> None:
    flat = _cost({1: 0.2, 40: 0.21})
    assert _policy(0.95, draft_step_s=0.01).choose(flat, 1) > _policy(0.3, draft_step_s=0.01).choose(flat, 1)
    assert _policy(0.2, draft_step_s=0.2).choose(flat, 1) == 0  # each draft step costs a target pass


def test_a_large_batch_makes_speculation_back_off_and_switch_off() -> None:
    compute_bound = _cost({1: 0.2, 8: 0.21, 64: 1.2})  # flat at first, then every token costs
    policy = _policy(0.7, draft_step_s=0.02)
    ks = [policy.choose(compute_bound, batch) for batch in (1, 8, 32)]
    assert ks[0] > ks[1] > ks[2] and ks[2] == 0


def test_switched_off_it_still_probes_to_keep_measuring() -> None:
    policy = _policy(0.1, draft_step_s=0.2)
    flat = _cost({1: 0.2, 40: 0.21})
    ks = [policy.choose(flat, 1) for _ in range(16)]
    assert ks.count(1) == 2 and set(ks) == {0, 1}


def test_a_replica_decides_one_k_for_all_its_sessions_per_period() -> None:
    flat = _cost({1: 0.2, 40: 0.21})
    shared = SharedAdaptiveK(_policy(0.95, draft_step_s=0.01), period_s=1.0)
    first = shared.choose(flat, 1, now=10.0)
    shared.policy.num_accepted, shared.policy.num_rejected = 5.0, 95.0  # acceptance collapses...
    assert shared.choose(flat, 1, now=10.5) == first  # ...but the period has not passed
    assert shared.choose(flat, 1, now=11.0) < first
