"""The replay harness: rebuilt round times give back a sweep's measured throughput, a fixed k replays its
own, and the command reports per load. The policy's outcomes over replays are in test_adaptive_outcomes.py."""

from __future__ import annotations

import json

import pytest

from specserve.bench.adaptive_replay import Landscape, ReplayConfig, StepCosts, conditional, main, replay

DEEP_RATES = [0.9, 0.81, 0.73, 0.66]  # each position 0.9 given the ones before it


def _rows(speedups: dict[int, dict[int, float]]) -> list[dict]:
    rows = []
    for load, by_k in speedups.items():
        base = 4.0 * load
        for k, speedup in by_k.items():
            mode = "target-only" if k == 0 else f"k={k}"
            rows.append({"mode": mode, "concurrency": load, "temperature": 0.0, "request_rate": None,
                         "tokens_per_second": base * speedup, "acceptance_at_position": DEEP_RATES[:k]})  # fmt: skip
    rows.append({"mode": "adaptive", "concurrency": 1, "temperature": 0.0, "request_rate": None,
                 "tokens_per_second": 1e9, "acceptance_at_position": []})  # fmt: skip
    return rows


LIGHT_THEN_HEAVY = {1: {0: 1.0, 1: 1.5, 2: 1.8, 4: 2.1}, 16: {0: 1.0, 1: 0.8, 2: 0.7, 4: 0.5}}


def test_reported_acceptance_becomes_acceptance_given_the_positions_before() -> None:
    assert conditional([0.9, 0.81, 0.729]) == pytest.approx([0.9, 0.9, 0.9])
    assert conditional([0.5, 0.0, 0.0]) == [0.5, 0.0, 0.0]


def test_round_times_give_back_the_measured_throughput() -> None:
    landscape = Landscape.from_rows(_rows(LIGHT_THEN_HEAVY))
    assert landscape.loads == [1, 16] and landscape.max_k(1) == 4  # the adaptive row is not a measurement
    for load, by_k in LIGHT_THEN_HEAVY.items():
        for k, speedup in by_k.items():
            rate = load * landscape.expected_tokens(load, k) / landscape.round_seconds(load, k)
            assert rate == pytest.approx(4.0 * load * speedup)
    assert landscape.speedup(1, 3) == pytest.approx(1.95)  # between k = 2 and k = 4


def test_a_fixed_k_replayed_without_noise_measures_its_throughput() -> None:
    landscape = Landscape.from_rows(_rows(LIGHT_THEN_HEAVY))
    quiet = ReplayConfig(seconds_per_load=600.0, warmup_s=0.0, noise=0.0, stall_probability=0.0)
    for k in (0, 2, 4):
        tokens_per_second, mean_k = replay(landscape, quiet, seed=1, fixed_k=k)[1]
        assert mean_k == k
        assert tokens_per_second == pytest.approx(4.0 * LIGHT_THEN_HEAVY[1][k], rel=0.05)


def test_a_sweep_without_target_only_is_refused() -> None:
    rows = [r for r in _rows(LIGHT_THEN_HEAVY) if not (r["mode"] == "target-only" and r["concurrency"] == 16)]
    with pytest.raises(ValueError, match="load 16"):
        Landscape.from_rows(rows)


def test_the_command_prints_a_line_per_load(tmp_path, capsys) -> None:
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"rows": _rows(LIGHT_THEN_HEAVY)}))
    assert main([str(sweep), "--paths", "2", "--seconds-per-load", "60"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[1].split()[:2] == ["1", "4"] and lines[2].split()[:2] == ["16", "0"]


def test_a_landscape_from_step_costs_prices_a_round_as_draft_steps_plus_a_verify() -> None:
    steps = StepCosts(draft_step_s=0.01, verify_s={1: 0.03, 5: 0.07})
    assert steps.verify(3) == pytest.approx(0.05) and steps.verify(9) == pytest.approx(0.11)  # along the slope
    landscape = Landscape.from_costs(steps, [0.5, 0.5])
    assert landscape.tokens_per_second(1, 0) == pytest.approx(1 / 0.03)
    assert landscape.tokens_per_second(1, 2) == pytest.approx(1.75 / (0.02 + 0.05))
