"""Host overhead per round (specserve/bench/overhead.py) and the workers' pass clock it subtracts."""

from __future__ import annotations

import threading
import time

import pytest

from specserve.bench.overhead import HostOverhead, overhead_figures
from specserve.core.stats import SpeculationStats
from specserve.models.pass_clock import model_pass, take_pass_seconds, with_pass_seconds


def test_host_overhead_is_wall_per_round_less_the_passes_it_waited_for() -> None:
    one = SpeculationStats(num_rounds=100, time_to_first_token_s=0.05, draft_pass_s=0.0, target_pass_s=0.08)
    two = SpeculationStats(num_rounds=50, time_to_first_token_s=0.05, draft_pass_s=0.1, target_pass_s=0.05)
    overhead = HostOverhead.of([(0.25, one), (0.35, two)])  # rounds' wall: 0.2 s and 0.3 s
    assert overhead.num_rounds == 150
    assert overhead.wall_ms_per_round == pytest.approx(500 / 150)
    assert overhead.pass_ms_per_round == pytest.approx(230 / 150)
    assert overhead.host_ms_per_round == pytest.approx(270 / 150)
    summed = SpeculationStats(num_rounds=150, time_to_first_token_s=0.1, draft_pass_s=0.1, target_pass_s=0.13)
    assert overhead_figures(0.6, summed)["host_overhead_ms_per_round"] == pytest.approx(270 / 150, abs=1e-3)
    assert HostOverhead.of([]).host_ms_per_round == 0.0


def test_the_pass_clock_counts_only_passes_and_only_on_its_own_thread() -> None:
    take_pass_seconds()
    with model_pass():
        time.sleep(0.02)
    time.sleep(0.02)  # outside a pass: not counted
    other: list[float] = []
    thread = threading.Thread(target=lambda: other.append(take_pass_seconds()))
    thread.start()
    thread.join()
    assert other == [0.0]
    assert 0.02 <= take_pass_seconds() < 0.04
    assert take_pass_seconds() == 0.0  # taken


def test_a_batch_reports_its_pass_seconds_with_every_result_and_errors_stay_errors() -> None:
    def run_batch(calls: list[int]) -> list[int | Exception]:
        with model_pass():
            time.sleep(0.01)
        return [ValueError("bad") if c < 0 else 2 * c for c in calls]

    with model_pass():  # a pass before the batch is not the batch's
        time.sleep(0.05)
    results = with_pass_seconds(run_batch)([1, -1, 3])
    assert isinstance(results[1], ValueError)
    (two, seconds), (six, same) = results[0], results[2]  # type: ignore[misc]
    assert (two, six) == (2, 6) and seconds == same and 0.01 <= seconds < 0.05
