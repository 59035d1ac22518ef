"""The load sweep's schedule: the modes take turns, every other time in reverse order."""

from __future__ import annotations

import pytest

from specserve.bench import load
from specserve.bench.load import LoadRun, sweep


def test_the_modes_take_turns_in_alternating_order_so_a_steady_drift_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    turns: list[tuple[int, str, int]] = []

    def measured(clients, mode, concurrency, prompts, max_tokens, requests_per_client, category, temperature,
                 repeat, duration_s, warmup_s) -> LoadRun:  # fmt: skip
        # a machine speeding up steadily: each turn measures one token/s more than the one before
        turns.append((concurrency, mode, repeat))
        run = LoadRun(mode, concurrency, seconds=1.0, counted_tokens=len(turns))
        run.turns = [float(len(turns))]
        return run

    monkeypatch.setattr(load, "run_load", measured)
    rows = sweep({}, {"code": []}, [1, 4], 16, 1, log=False, modes=("adaptive", "target-only#2"), repeats=2)
    assert turns[:6] == [
        (1, "target-only", 0), (1, "adaptive", 0), (1, "target-only#2", 0),
        (1, "target-only#2", 1), (1, "adaptive", 1), (1, "target-only", 1),
    ]  # fmt: skip
    assert [r["mode"] for r in rows[:3]] == ["target-only", "adaptive", "target-only#2"]
    assert {r["tokens_per_second"] for r in rows[:3]} == {3.5} and {r["tokens_per_second"] for r in rows[3:]} == {9.5}
