"""Replaying the adaptive policy against a sweep's measurements: the rebuilt round times give back the
measured throughput, and the policy driven through them behaves as it does served."""

from __future__ import annotations

import json

import pytest

from specserve.bench.adaptive_replay import Landscape, ReplayConfig, conditional, evaluate, main, replay

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


def test_the_policy_speculates_deep_alone_and_stops_under_load() -> None:
    landscape = Landscape.from_rows(_rows(LIGHT_THEN_HEAVY))
    quiet = ReplayConfig(seconds_per_load=180.0, noise=0.0, stall_probability=0.0, paths=3)
    light, heavy = evaluate(landscape, quiet)
    assert (light["best_fixed_k"], heavy["best_fixed_k"]) == (4, 0)
    assert light["adaptive_mean_speedup"] > 0.85 * 2.1 and light["adaptive_mean_k"] > 2.5
    assert heavy["adaptive_mean_speedup"] > 0.95 and heavy["adaptive_mean_k"] < 0.5
    assert heavy["best_fixed_below_rule"] == 0.0  # target-only against itself, without noise


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


def test_a_fresh_policy_under_load_pays_little_for_the_drafts_catching_up() -> None:
    """Where target-only is fastest, each exploration from it first has every session's draft catch up on its
    context (`catch_up_s` each): a fresh policy meeting 8 then 16 clients explores rarely enough to keep
    target-only's pace."""
    heavy = {8: {0: 1.0, 1: 0.85, 2: 0.8, 4: 0.75}, 16: {0: 1.0, 1: 0.8, 2: 0.7, 4: 0.6}}
    landscape = Landscape.from_rows(_rows(heavy))
    rows = evaluate(landscape, ReplayConfig(catch_up_s=0.4, paths=20))
    assert [row["concurrency"] for row in rows] == [8, 16]
    assert all(row["adaptive_mean_speedup"] > 0.98 and row["adaptive_mean_k"] < 0.1 for row in rows), rows


def test_a_batch_one_short_now_and_then_does_not_leave_target_only_unpriced() -> None:
    """At 4 clients a decision now and then sees 3 sessions (one between requests), another batch size bucket:
    leaving target-only there is priced like an exploration too (unpriced, adaptive ran at 0.95x)."""
    landscape = Landscape.from_rows(_rows({1: {0: 1.0, 1: 1.5, 2: 1.8, 4: 2.1}, 4: {0: 1.0, 1: 0.95, 2: 0.93, 4: 0.9}}))
    rows = evaluate(landscape, ReplayConfig(catch_up_s=0.4, short_batch=0.2, paths=20))
    assert rows[1]["concurrency"] == 4 and rows[1]["adaptive_mean_speedup"] > 0.965, rows
