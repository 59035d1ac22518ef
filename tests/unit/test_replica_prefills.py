"""A target replica's prefill clock, and the timing of each prefill it gives the adaptive policy."""

from __future__ import annotations

import time

import pytest

from orchestrator.replicas import Replica


def test_a_prefill_alone_is_timed_and_on_the_clock() -> None:
    replica = Replica("127.0.0.1:1", client=None)  # type: ignore[arg-type] - no call is made
    with replica.prefilling() as timing:
        time.sleep(0.05)
    assert timing.alone and timing.seconds >= 0.05
    assert replica.prefill_clock() == pytest.approx(timing.seconds)


def test_overlapping_prefills_are_not_alone_and_count_on_the_clock_once() -> None:
    """One prefill beside another waits for it: its seconds are not what a prefill costs."""
    replica = Replica("127.0.0.1:1", client=None)  # type: ignore[arg-type] - no call is made
    with replica.prefilling() as first:
        with replica.prefilling() as second:
            time.sleep(0.02)
        time.sleep(0.02)
    with replica.prefilling() as third:
        time.sleep(0.01)
    assert not first.alone and not second.alone and third.alone
    assert first.seconds >= second.seconds + 0.02 and second.seconds >= 0.02
    assert replica.prefill_clock() == pytest.approx(first.seconds + third.seconds)  # the overlap once
