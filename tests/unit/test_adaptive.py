"""The adaptive speculation policy: per replica, the k with the most expected tokens per second from pooled
acceptance and round times measured at about this batch size, re-measuring neighbouring choices (and
target-only) now and then."""

from __future__ import annotations

import random

import pytest

from specserve.core.adaptive import AdaptiveK, RoundTime, batch_bucket, expected_tokens

ACCEPTANCE = 0.8


def _run(
    policy: AdaptiveK,
    seconds_at: dict[int, float],
    batch_size: int,
    duration_s: float,
    start: float = 0.0,
    acceptance: float = ACCEPTANCE,
) -> list[int]:
    """Drive the policy for `duration_s` of simulated time: a round at k takes seconds_at[k] and accepts each
    draft with probability `acceptance` until the first rejection; one observation per session of the batch.
    Returns the k of every round."""
    rng = random.Random(0)
    now, ks = start, []
    while now < start + duration_s:
        k = policy.choose(batch_size, now)
        now += seconds_at[k]
        for _ in range(batch_size):
            num_accepted = next((i for i in range(k) if rng.random() >= acceptance), k)
            policy.observe(batch_size, k, num_accepted, seconds_at[k], now)
        ks.append(k)
    return ks


def _rate(seconds_at: dict[int, float], k: int, acceptance: float = ACCEPTANCE) -> float:
    return expected_tokens(acceptance, k) / seconds_at[k]


def _share(ks: list[int], wanted: set[int]) -> float:
    late = ks[len(ks) // 3 :]  # after the first measurements
    return sum(k in wanted for k in late) / len(late)


# one client on a memory-bound target: a pass costs about the same for 1 or 9 tokens, a draft step 0.06 s
LIGHT = {k: 0.25 + 0.01 * k + 0.06 * k for k in range(9)}
# many clients: every draft token costs the batch's pass a lot
HEAVY = {k: 0.5 + 0.6 * k for k in range(9)}


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_round_time_is_a_weighted_mean_of_recent_rounds() -> None:
    round_time = RoundTime()
    for _ in range(50):
        round_time.observe(1.0, now=1.0)
    for _ in range(50):
        round_time.observe(2.0, now=2.0)  # the past fades
    assert round_time.seconds == pytest.approx(2.0, rel=1e-2)
    assert round_time.updated_at == 2.0


def test_batch_buckets_group_nearby_sizes() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4)] == [0, 2, 3, 4]
    assert batch_bucket(7) == batch_bucket(8) == batch_bucket(9) != batch_bucket(16)


def test_nothing_measured_yet_starts_at_the_initial_k() -> None:
    assert AdaptiveK(6).choose(1, now=0.0) == 4
    assert AdaptiveK(2).choose(1, now=0.0) == 2


def test_acceptance_is_accepted_over_accepted_plus_rejections() -> None:
    policy = AdaptiveK(8, prior_weight=0.0)
    policy.observe(1, 4, 4, 0.5, now=0.0)  # all four accepted: no rejection
    policy.observe(1, 4, 1, 0.5, now=0.0)  # one accepted, then a rejection
    policy.observe(1, 0, 0, 0.3, now=0.0)  # target-only: nothing to accept
    assert policy.acceptance == pytest.approx(5 / 6, rel=0.02)


def test_it_settles_on_the_fastest_k_and_rarely_leaves_it() -> None:
    best = max(range(9), key=lambda k: _rate(LIGHT, k))
    near_best = {k for k in range(9) if _rate(LIGHT, k) >= 0.97 * _rate(LIGHT, best)}
    assert 0 not in near_best and len(near_best) < 5
    ks = _run(AdaptiveK(8), LIGHT, batch_size=1, duration_s=300)
    assert _share(ks, near_best) > 0.8
    assert _share(ks, {0}) < 0.03  # target-only is re-measured, rarely: it is far slower


def test_it_switches_speculation_off_when_target_only_is_faster() -> None:
    assert max(range(9), key=lambda k: _rate(HEAVY, k)) == 0
    ks = _run(AdaptiveK(8), HEAVY, batch_size=16, duration_s=600)
    assert _share(ks, {0}) > 0.85
    assert set(ks[len(ks) // 3 :]) <= {0, 1}  # k = 1 is still tried now and then


def test_it_follows_the_load_from_deep_speculation_to_none_and_back() -> None:
    policy = AdaptiveK(8)
    _run(policy, LIGHT, batch_size=1, duration_s=120)
    heavy = _run(policy, HEAVY, batch_size=16, duration_s=600, start=120)
    assert _share(heavy, {0}) > 0.85
    light = _run(policy, LIGHT, batch_size=1, duration_s=120, start=720)  # the one-client figures were kept
    assert _share(light, {0}) < 0.1


def test_low_acceptance_switches_speculation_off() -> None:
    ks = _run(AdaptiveK(8), LIGHT, batch_size=1, duration_s=300, acceptance=0.05)
    assert _share(ks, {0}) > 0.8


def test_a_replica_decides_once_per_period() -> None:
    policy = AdaptiveK(8, period_s=1.0)
    first = policy.choose(1, now=10.0)
    for _ in range(10):
        policy.observe(1, first, 0, 1.0, now=10.2)
    assert policy.choose(1, now=10.5) == first  # the period has not passed
    assert policy.choose(1, now=11.0) != first  # a neighbour or target-only is measured next


def test_an_unmeasured_batch_size_borrows_the_nearest_round_times() -> None:
    policy = AdaptiveK(8, prior_weight=0.0)
    for k, seconds in {0: 1.0, 1: 1.2, 2: 1.4}.items():
        for _ in range(5):
            policy.observe(2, k, k, seconds, now=0.0)  # every draft accepted
    assert policy.estimate(batch_bucket(3), 2) == pytest.approx(3 / 1.4)
    assert policy.estimate(batch_bucket(3), 5) is None
