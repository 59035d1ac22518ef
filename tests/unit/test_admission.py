"""The orchestrator's admission gate: a fixed number run, the next ones queue in arrival order, the rest are
refused with a retry hint; a waiter that gives up never leaks or loses a slot."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.admission import Admission
from specserve.rpc import OverloadedError


def test_slots_queue_in_order_and_pass_on() -> None:
    async def scenario() -> list[str]:
        gate, order = Admission(max_running=2, max_queued=2, queue_timeout_s=5), []
        first, second = await gate.acquire(), await gate.acquire()

        async def waiter(name: str) -> None:
            taken = await gate.acquire()
            order.append(name)
            gate.release(taken)

        waiters = [asyncio.ensure_future(waiter(n)) for n in ("c", "d")]
        await asyncio.sleep(0.01)
        assert (gate.num_running, gate.num_queued) == (2, 2)
        with pytest.raises(OverloadedError) as raised:  # the queue is full: refused at once
            await gate.acquire()
        assert raised.value.retry_after_s is not None and raised.value.retry_after_s > 0
        assert "retry in" in str(raised.value) and "max_queued_requests 2" in str(raised.value)
        gate.release(first)
        gate.release(second)
        await asyncio.gather(*waiters)
        assert (gate.num_running, gate.num_queued, gate.num_refused) == (0, 0, 1)
        return order

    assert asyncio.run(scenario()) == ["c", "d"]


def test_a_queued_request_times_out_and_a_cancelled_one_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = Admission(max_running=1, max_queued=4, queue_timeout_s=0.05)
        held = await gate.acquire()
        with pytest.raises(OverloadedError, match="queue timeout"):
            await gate.acquire()
        cancelled = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert (gate.num_running, gate.num_queued) == (1, 0)
        gate.release(held)
        assert gate.num_running == 0
        again = await gate.acquire()  # the slot is free again, nothing leaked
        gate.release(again)

    asyncio.run(scenario())


def test_a_slot_handed_to_a_waiter_that_just_left_passes_on() -> None:
    async def scenario() -> None:
        gate = Admission(max_running=1, max_queued=4, queue_timeout_s=5)
        held = await gate.acquire()
        leaving = asyncio.ensure_future(gate.acquire())
        staying = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.01)
        gate.release(held)  # the slot goes to `leaving`...
        leaving.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await leaving
        gate.release(await asyncio.wait_for(staying, 1))  # so it reached `staying`
        assert (gate.num_running, gate.num_queued) == (0, 0)

    asyncio.run(scenario())
