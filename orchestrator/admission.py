"""Backpressure: at most `max_running` requests hold sessions at once; the next `max_queued` wait in
arrival order for up to `queue_timeout_s`; anything past that is refused at once with RESOURCE_EXHAUSTED
and a retry hint, so overload costs callers a retry instead of costing the workers their memory."""

from __future__ import annotations

import asyncio
import collections
import time

from specserve.rpc import OverloadedError

MIN_RETRY_AFTER_S = 0.1


class Admission:
    def __init__(self, max_running: int, max_queued: int, queue_timeout_s: float) -> None:
        self.max_running, self.max_queued, self.queue_timeout_s = max_running, max_queued, queue_timeout_s
        self.num_running = 0
        self.num_refused = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._mean_request_s = 1.0  # running mean of how long a request holds its slot: the retry hint's unit

    @property
    def num_queued(self) -> int:
        return len(self._waiting)

    def retry_after_s(self) -> float:
        """About when a slot frees for a caller who would queue behind everyone waiting now."""
        return max(MIN_RETRY_AFTER_S, self._mean_request_s * (len(self._waiting) + 1) / self.max_running)

    async def acquire(self) -> float:
        """Wait for a slot (raises OverloadedError past the queue or its timeout); returns when it was taken."""
        if self.num_running < self.max_running and not self._waiting:
            self.num_running += 1
            return time.perf_counter()
        if len(self._waiting) >= self.max_queued:
            self._refuse(f"{self.num_running} requests are running and {len(self._waiting)} are queued (the limits)")
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(slot)
        try:
            await asyncio.wait((slot,), timeout=self.queue_timeout_s)
        except asyncio.CancelledError:
            self._leave(slot)
            raise
        if not slot.done():
            self._leave(slot)
            self._refuse(f"no request slot freed within the queue timeout ({self.queue_timeout_s:g}s)")
        return time.perf_counter()

    def release(self, taken_at: float) -> None:
        self._mean_request_s += 0.1 * (time.perf_counter() - taken_at - self._mean_request_s)
        self._pass_on()

    def _pass_on(self) -> None:
        while self._waiting:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(None)  # the slot passes straight on: num_running does not change
                return
        self.num_running -= 1

    def _leave(self, slot: asyncio.Future[None]) -> None:
        """A waiter gives up: if the slot reached it meanwhile, pass it on; else drop it from the queue."""
        if slot.done():
            self._pass_on()
        else:
            slot.cancel()
            self._waiting.remove(slot)

    def _refuse(self, why: str) -> None:
        self.num_refused += 1
        retry_after_s = self.retry_after_s()
        raise OverloadedError(
            f"overloaded: {why}; retry in {retry_after_s:.1f}s "
            f"(max_concurrent_requests {self.max_running}, max_queued_requests {self.max_queued})",
            retry_after_s,
        )
