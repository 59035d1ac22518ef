"""The soak run in reduced form (`python -m specserve.bench.soak`; the full form's figures are in
docs/reliability.md): target, draft and orchestrator as child processes under concurrent streaming clients."""

from __future__ import annotations

import pytest

from specserve.bench.soak import SoakConfig, format_result, run_soak


@pytest.fixture(autouse=True)
def _one_thread_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # four processes share the test machine's cores


def test_concurrent_streams_are_correct_leave_no_sessions_and_no_memory_growth() -> None:
    # 80 warm-up requests: the draft's allocator reaches its high-water mark late (2026-12-04: after 40 warm-up
    # requests it still grew 0-30 MiB over the next 40, past the limit in 4 runs of 7 at 133fa1d; after 80 it
    # grew 0.0 MiB over the next 80, twice)
    result = run_soak(SoakConfig(clients=8, requests=160, time_limit_s=300, warmup_fraction=0.5))
    assert result.passed, format_result(result)
    assert result.requests == result.identical == 160 and not result.errors
    assert set(result.rss_mib) == {"target", "draft", "orchestrator"}
    assert result.sessions_left == {"target": 0, "draft": 0, "orchestrator": 0}
    assert 0 < result.latency_p50_s <= result.latency_p99_s


def test_overload_is_refused_with_retry_hints_and_every_retry_is_served() -> None:
    flags = ["--max-concurrent-requests", "2", "--max-queued-requests", "2"]
    result = run_soak(
        SoakConfig(clients=8, requests=24, time_limit_s=300, warmup_fraction=0.5, orchestrator_flags=flags)
    )
    assert result.passed, format_result(result)
    assert result.refusals > 0 and result.identical == 24
    assert 0 < result.peak_sessions["target"] <= 2 and result.peak_sessions["draft"] <= 2  # never past the limit
