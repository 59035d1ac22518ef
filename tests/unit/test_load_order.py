"""The load sweep's schedule: the modes take turns, every other time in reverse order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from specserve.bench import load
from specserve.bench.load import LoadRun, sweep


def test_the_modes_take_turns_in_alternating_order_so_a_steady_drift_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    turns: list[tuple[int, str, int]] = []

    def measured(clients, mode, concurrency, prompts, max_tokens, requests_per_client, category, temperature,
                 repeat, duration_s, warmup_s, send=None) -> LoadRun:  # fmt: skip
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


def test_a_peer_s_modes_take_turns_too_its_servers_up_only_at_their_load(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple] = []

    def measured(clients, mode, concurrency, prompts, max_tokens, requests_per_client, category, temperature,
                 repeat, duration_s, warmup_s, send=None) -> LoadRun:  # fmt: skip
        events.append((concurrency, mode, repeat, send))
        return LoadRun(mode, concurrency, seconds=1.0, counted_tokens=1)

    @contextmanager
    def peers(prompts: list, concurrency: int) -> Iterator[dict]:
        events.append(("up", concurrency))
        yield {"llama.cpp target-only": f"send at {concurrency}"}
        events.append(("down", concurrency))

    monkeypatch.setattr(load, "run_load", measured)
    rows = sweep({}, {"code": []}, [1, 8], 16, 1, log=False, modes=("adaptive",), repeats=2, peers=peers)
    assert events[:8] == [
        ("up", 1), (1, "target-only", 0, None), (1, "adaptive", 0, None), (1, "llama.cpp target-only", 0, "send at 1"),
        (1, "llama.cpp target-only", 1, "send at 1"), (1, "adaptive", 1, None), (1, "target-only", 1, None),
        ("down", 1),
    ]  # fmt: skip
    assert events[8] == ("up", 8) and events[-1] == ("down", 8)
    assert [(r["concurrency"], r["mode"]) for r in rows] == [
        (c, m) for c in (1, 8) for m in ("target-only", "adaptive", "llama.cpp target-only")
    ]
