"""The worker's side of a round stream (ProposeRounds, VerifyRounds): every call of a message starts at once,
a session's calls in the order sent; results go back as they are ready, those ready together in one message.
A call's error is its own result, with the status its unary call would have answered; the stream serves on.
A call that decodes several tokens (a target-only run) also sends partial results as it goes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from specserve.logs import bind_request_id, log_call
from specserve.rpc import (
    BATCH_MESSAGE_BYTES,
    MAX_MESSAGE_BYTES,
    OverloadedError,
    UnavailableError,
    check_parsed,
    error_status,
)

Partial = Callable[[Any], None]
"""Sends a partial result of the call being answered (a response message holding what is new)."""


async def answer_batches(
    batches: AsyncIterator[Any],
    answer: Callable[[Any, Partial], Awaitable[Any]],
    results_type: Any,
    method: str,
    stopping: Callable[[], bool],
) -> AsyncIterator[Any]:
    """Results messages (`results_type`: pb.VerifyResults or pb.ProposeResults) for the calls of `batches`,
    each answered by `answer(request, partial)` as its unary call would be and logged as one (`method`);
    `partial(response)` sends a partial result ahead of the answer (VerifyResults only). Once
    `stopping()` calls are refused UNAVAILABLE, so their sessions move to another replica instead of riding
    out the grace. A message that does not parse ends the stream (INVALID_ARGUMENT), its calls unanswered."""
    outbox: list[list[Any]] = []  # [results message, bytes]: sent in order; results join the last one
    wake = asyncio.Event()
    running: dict[int, asyncio.Task[None]] = {}  # by call id
    latest: dict[str, asyncio.Task[None]] = {}  # each session's last call, which its next one waits for

    def result(call_id: int, size: int) -> Any:
        if not outbox or (outbox[-1][1] + size > BATCH_MESSAGE_BYTES and outbox[-1][1] > 0):
            outbox.append([results_type(), 0])
        outbox[-1][1] += size
        wake.set()
        return outbox[-1][0].results.add(call_id=call_id)

    def partial(call_id: int, response: Any) -> None:
        part = result(call_id, response.ByteSize() + 16)
        part.partial = True
        part.response.MergeFrom(response)

    async def run(call: Any, after: asyncio.Task[None] | None) -> None:
        bind_request_id(call.request_id or None)
        started = time.perf_counter()
        try:
            if after is not None:  # a session's rounds are sequential: one that follows waits
                await asyncio.wait((after,))
            if stopping():
                raise UnavailableError("the worker is shutting down")
            response = await answer(call.request, lambda response: partial(call.call_id, response))
            if (size := response.ByteSize() + 16) > MAX_MESSAGE_BYTES:  # alone it would end the stream
                raise OverloadedError(f"a {size}-byte response, over the {MAX_MESSAGE_BYTES}-byte message limit")
        except asyncio.CancelledError:  # the caller gave up on it: no result
            log_call(method, "CANCELLED", started)
            raise
        except Exception as error:  # noqa: BLE001 - mapped to a status, never lost
            code, details = error_status(error, method)
            failed = result(call.call_id, len(details) + 16).error
            failed.code, failed.details = code.value[0], details
            log_call(method, code.name, started)
        else:
            result(call.call_id, size).response.MergeFrom(response)
            log_call(method, "OK", started)

    def ended(call_id: int, session_id: str, task: asyncio.Task[None]) -> None:
        if running.get(call_id) is task:
            del running[call_id]
        if latest.get(session_id) is task:
            del latest[session_id]
        wake.set()

    def start(call: Any) -> None:
        session_id = call.request.session_id
        task = asyncio.ensure_future(run(call, latest.get(session_id)))
        task.add_done_callback(lambda t: ended(call.call_id, session_id, t))
        running[call.call_id] = latest[session_id] = task

    async def read() -> None:
        try:
            async for batch in batches:
                check_parsed(batch)
                for call_id in batch.cancelled_call_ids:
                    if (task := running.get(call_id)) is not None:
                        task.cancel()
                for call in batch.calls:
                    start(call)
        finally:
            wake.set()

    reading = asyncio.ensure_future(read())
    try:
        while True:
            if outbox:
                yield outbox.pop(0)[0]
                continue
            if reading.done() and (not running or reading.exception() is not None):
                reading.result()  # raises why the stream could not be read
                return
            await wake.wait()
            wake.clear()
    finally:
        reading.cancel()
        for task in list(running.values()):
            task.cancel()
