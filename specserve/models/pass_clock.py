"""Seconds a thread spends in the model's forward passes, so that a worker can report them per call and
the served stack's host overhead (a round's wall time less its passes) can be measured."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

C = TypeVar("C")
R = TypeVar("R")

_local = threading.local()


@contextmanager
def model_pass() -> Iterator[None]:
    """Around one forward pass (and its wait for the device): its time counts for this thread."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _local.seconds = getattr(_local, "seconds", 0.0) + time.perf_counter() - started


def take_pass_seconds() -> float:
    """The pass time this thread counted since the last take."""
    seconds, _local.seconds = getattr(_local, "seconds", 0.0), 0.0
    return seconds


def with_pass_seconds(
    run_batch: Callable[[list[C]], list[R | Exception]],
) -> Callable[[list[C]], list[tuple[R, float] | Exception]]:
    """run_batch whose results carry the seconds the batch spent in forward passes (shared by its calls)."""

    def run(calls: list[C]) -> list[tuple[R, float] | Exception]:
        take_pass_seconds()  # whatever ran before this batch on the thread is not its
        results = run_batch(calls)
        seconds = take_pass_seconds()
        return [result if isinstance(result, Exception) else (result, seconds) for result in results]

    return run
