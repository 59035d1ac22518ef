"""The model thread: every model call of a worker runs on one thread, passes and prompt chunks taking turns,
so the event loop stays free for other RPCs while the model computes."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from specserve.openmp import release_idle_threads

T = TypeVar("T")


class ModelExecutor:
    """Runs model calls one at a time on the model thread, the event loop staying free for other RPCs
    meanwhile; only passes known to be short run on the loop's thread instead (`timed`). All of a worker's
    torch compute goes through here, its load included (see specserve.worker.serve).

    Two classes of call take turns when both wait: passes (the batched Verify or Propose of the sessions
    under way) and background work (prompt chunks of new requests). First come, first served, a burst of
    new requests held the sessions' passes behind every prompt queued before them: at 16 clients on two
    cores 16 prefills of 2.5 s each came first, a session's Verify waited 30 s, hit its deadline and the
    replica was taken for failed (its sessions rebuilt by more prefills). Taking turns, a pass waits for
    at most one prompt chunk, and a prompt chunk for at most one pass."""

    inline_below_s = 0.0
    """A pass whose predecessor took less than this runs on the event loop's thread (WorkerServiceConfig)."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._busy = False
        self._last_pass_s = math.inf
        self._waiting: dict[bool, deque[asyncio.Future[None]]] = {False: deque(), True: deque()}
        self._last_background = False

    async def run(self, fn: Callable[..., T], *args: Any, background: bool = False) -> T:
        """fn(*args) on the model thread; `background`: a prompt chunk, which takes turns with passes."""
        await self._acquire(background)
        self._last_background = background
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        # released when the thread is done, not when the caller stops waiting: a cancelled caller's call
        # still holds the model until it returns
        future.add_done_callback(lambda _: self._release())
        return await asyncio.shield(future)

    def _pause_if_idle(self) -> None:
        """On the thread that ran the last call, queued once the model is free: an idle model frees the cores
        (specserve/openmp.py). Queued after the result went back, so no caller waits for the pause; a call
        that took the model meanwhile keeps its team."""
        if not self._busy:
            release_idle_threads()

    async def timed(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """A pass: (result, seconds it computed), the queueing before it excluded. When the last pass took
        less than `inline_below_s` this one runs on the calling thread, the event loop's: handing a short
        pass to the model thread and its result back costs two thread wake-ups, as much as the pass itself
        for small models or graph replays. A longer pass keeps the loop free for other RPCs meanwhile."""

        def call() -> tuple[T, float]:
            started = time.perf_counter()
            result = fn(*args)
            self._last_pass_s = time.perf_counter() - started
            return result, self._last_pass_s

        if self._last_pass_s >= self.inline_below_s:
            return await self.run(call)
        await self._acquire(background=False)
        self._last_background = False
        try:
            return call()
        finally:
            self._release(inline=True)

    def has_waiting(self) -> bool:
        """Whether a call waits for the model (read from the model thread too: a run's passes yield to it)."""
        return bool(self._waiting[False] or self._waiting[True])

    def observe_pass(self, seconds: float) -> None:
        """The last pass took `seconds`, whatever the timed call around it took (a run's several passes)."""
        self._last_pass_s = seconds

    async def _acquire(self, background: bool) -> None:
        if not self._busy:  # then nothing waits: _release hands the model on while anything does
            self._busy = True
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[background].append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled: pass the turn on
                self._release()
            elif granted in self._waiting[background]:  # else _release dropped it already
                self._waiting[background].remove(granted)
            raise

    def _release(self, inline: bool = False) -> None:
        """The model is free: the next call, the other class first when both wait. `inline`: the call ran
        on the loop's thread, whose OpenMP team is then the one to pause (each thread has its own)."""
        order = (not self._last_background, self._last_background)
        for background in order:
            while self._waiting[background]:
                granted = self._waiting[background].popleft()
                if not granted.done():
                    granted.set_result(None)
                    return
        self._busy = False
        if inline:
            asyncio.get_running_loop().call_soon(self._pause_if_idle)
            return
        try:
            self._pool.submit(self._pause_if_idle)
        except RuntimeError:  # shut down: no pass comes again
            pass

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
