"""Continuous batching: the calls that queue while the model computes share its next pass."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from specserve.worker.executor import ModelExecutor

C = TypeVar("C")
R = TypeVar("R")

GATHER_FRACTION = 0.2  # of the last pass's time: how long a pass may wait for sessions expected back
MAX_GATHER_S = 0.05

Again = Callable[[R, float, list[C]], bool]
"""Hears a call's result on the model thread (with the pass's seconds and calls): whether it runs again."""


@dataclass(slots=True)
class _Queued(Generic[C, R]):
    call: C
    future: asyncio.Future[tuple[R, float, list[C]]]
    again: Again[R, C] | None = None
    session: str = field(default="")


class BatchQueue(Generic[C, R]):
    """Continuous batching: calls that arrive while the model is busy run together in its next pass.

    Whatever queued during a pass (up to `max_batch_size`, one call per session) forms the next batch.
    A lone call on an idle model runs at once. Only when sessions of the previous pass are not back yet
    does a pass wait for them, briefly: without that, two sessions whose calls arrive a round trip apart
    alternate passes forever instead of sharing them. It waits while they keep arriving, until none has
    for a fifth of the last pass (at most 50 ms), and for one last pass's time at most: sessions' calls
    may come back in several messages (their rounds took different paths through the orchestrator), and a
    fixed wait would split them into two passes, each waiting for the other's. The calls of one message
    (specserve/worker/rounds.py) all queue before the pass gathers: when they bring back every session
    of the last pass, it starts at once.

    A call may run several passes (`again`: a target-only run). While nothing else waits for the model,
    its next pass follows on the model thread at once, without a trip through the event loop (that trip
    cost 0.7-1.0 ms a pass here); once another call or a prompt chunk waits, it queues again like them.
    """

    def __init__(
        self,
        executor: ModelExecutor,
        run_batch: Callable[[list[C]], list[R | Exception]],
        session_of: Callable[[C], str],
        max_batch_size: int,
    ) -> None:
        self.executor, self.run_batch, self.session_of = executor, run_batch, session_of
        self.max_batch_size = max_batch_size
        self._waiting: list[_Queued[C, R]] = []
        self._running = False
        self._arrived = asyncio.Event()
        self._last_sessions: set[str] = set()
        self._last_pass_s = 0.0

    async def submit(self, call: C, again: Again[R, C] | None = None) -> tuple[R, float, list[C]]:
        """(result, seconds the batch computed, the calls that shared it) of the call's last pass; raises the
        call's own error. `again(result, seconds, calls)`, on the model thread after each of its passes:
        whether the call runs another one."""
        future: asyncio.Future[tuple[R, float, list[C]]] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Queued(call, future, again, self.session_of(call)))
        self._arrived.set()
        if not self._running:
            self._running = True
            asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                await self._gather()
                batch = self._take_batch()
                try:
                    (finished, going, calls, seconds), _ = await self.executor.timed(self._passes, batch)
                except Exception as error:  # noqa: BLE001 - the whole pass failed: every call in it hears why
                    finished, going, seconds = [(item, error) for item in batch], [], 0.0
                    calls = [item.call for item in batch]
                self.executor.observe_pass(seconds)
                self._last_sessions, self._last_pass_s = {self.session_of(c) for c in calls}, seconds
                self._waiting[:0] = going  # runs that go on, first in the next batch
                for item, result in finished:
                    if item.future.done():  # the caller went away
                        continue
                    if isinstance(result, Exception):
                        item.future.set_exception(result)
                    else:
                        item.future.set_result((result, seconds, calls))
        finally:
            self._running = False

    def _passes(
        self, batch: list[_Queued[C, R]]
    ) -> tuple[list[tuple[_Queued[C, R], R | Exception]], list[_Queued[C, R]], list[C], float]:
        """The batch's pass, and more while every call in it runs again and nothing else waits for the model
        (never on the event loop's thread: other RPCs would wait meanwhile). -> (finished calls with their
        results, calls that run again, the last pass's calls and its seconds)."""
        while True:
            finished: list[tuple[_Queued[C, R], R | Exception]] = []
            calls = [item.call for item in batch]
            started = time.perf_counter()
            results = self.run_batch(calls)
            seconds = time.perf_counter() - started
            going = []
            for item, result in zip(batch, results):
                if item.future.done():  # cancelled: it runs no further
                    continue
                if isinstance(result, Exception) or item.again is None:
                    finished.append((item, result))
                    continue
                try:
                    again = item.again(result, seconds, calls)
                except Exception as error:  # noqa: BLE001 - the call's own failure
                    finished.append((item, error))
                    continue
                if again:
                    going.append(item)
                else:
                    finished.append((item, result))
            # a finished call's result goes back at once; so do the others' when anything else waits
            if finished or not going or self._waiting or self.executor.has_waiting() or _on_event_loop():
                return finished, going, calls, seconds
            batch = going

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        gap = min(MAX_GATHER_S, GATHER_FRACTION * self._last_pass_s)
        limit = loop.time() + min(MAX_GATHER_S, self._last_pass_s)
        deadline = loop.time() + gap
        while len(self._waiting) < self.max_batch_size:
            if not self._last_sessions - {item.session for item in self._waiting}:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(deadline, limit) - loop.time())
            except TimeoutError:
                return
            deadline = loop.time() + gap  # one came: wait for the others as long again

    def _take_batch(self) -> list[_Queued[C, R]]:
        batch: list[_Queued[C, R]] = []
        rest: list[_Queued[C, R]] = []
        sessions: set[str] = set()
        for item in self._waiting:
            if item.future.done():
                continue
            if len(batch) < self.max_batch_size and item.session not in sessions:
                batch.append(item)
                sessions.add(item.session)
            else:
                rest.append(item)
        self._waiting = rest
        return batch


def _on_event_loop() -> bool:
    """Whether this thread runs an event loop (a pass run inline, ModelExecutor.timed)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
