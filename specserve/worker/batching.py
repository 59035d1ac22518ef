"""Continuous batching: the calls that queue while the model computes share its next pass."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from specserve.worker.executor import ModelExecutor

C = TypeVar("C")
R = TypeVar("R")

GATHER_FRACTION = 0.2  # of the last pass's time: how long a pass may wait for sessions expected back
MAX_GATHER_S = 0.05


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
        self._waiting: list[tuple[C, asyncio.Future[tuple[R, float, list[C]]]]] = []
        self._running = False
        self._arrived = asyncio.Event()
        self._last_sessions: set[str] = set()
        self._last_pass_s = 0.0

    async def submit(self, call: C) -> tuple[R, float, list[C]]:
        """(result, seconds the batch computed, the calls that shared it); raises the call's own error."""
        future: asyncio.Future[tuple[R, float, list[C]]] = asyncio.get_running_loop().create_future()
        self._waiting.append((call, future))
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
                calls = [call for call, _ in batch]
                try:
                    results, seconds = await self.executor.timed(self.run_batch, calls)
                except Exception as error:  # noqa: BLE001 - the whole pass failed: every call in it hears why
                    results, seconds = [error] * len(batch), 0.0
                self._last_sessions, self._last_pass_s = {self.session_of(c) for c in calls}, seconds
                for (_, future), result in zip(batch, results):
                    if future.done():  # the caller went away
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result((result, seconds, calls))
        finally:
            self._running = False

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        gap = min(MAX_GATHER_S, GATHER_FRACTION * self._last_pass_s)
        limit = loop.time() + min(MAX_GATHER_S, self._last_pass_s)
        deadline = loop.time() + gap
        while len(self._waiting) < self.max_batch_size:
            if not self._last_sessions - {self.session_of(call) for call, _ in self._waiting}:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(deadline, limit) - loop.time())
            except TimeoutError:
                return
            deadline = loop.time() + gap  # one came: wait for the others as long again

    def _take_batch(self) -> list[tuple[C, asyncio.Future[tuple[R, float, list[C]]]]]:
        batch, rest, sessions = [], [], set()
        for item in self._waiting:
            session = self.session_of(item[0])
            if len(batch) < self.max_batch_size and session not in sessions and not item[1].done():
                batch.append(item)
                sessions.add(session)
            elif not item[1].done():
                rest.append(item)
        self._waiting = rest
        return batch
