"""Every session's round calls (Propose or Verify) to one worker on one bidirectional stream: the calls made in
one event-loop iteration travel in one message, and the worker sends results as they are ready. A call fails
as a unary call would: an AioRpcError with the worker's status, so failover and retries are unchanged."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from specserve.logs import RpcObserver, current_request_id
from specserve.rpc import BATCH_MESSAGE_BYTES, MAX_MESSAGE_BYTES

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class RoundMux:
    """A worker client's round calls, all sessions' on one stream: opened by the first call, and again by the
    first call after it ended. A failed, timed-out or cancelled call leaves the stream to the others."""

    def __init__(
        self, address: str, open_stream: Callable[[], Any], batch_type: Any, method: str, observe: RpcObserver | None
    ) -> None:
        """address: the worker's, named in every error (as the unary calls name it); open_stream: the stub's
        ProposeRounds or VerifyRounds; batch_type: its request message (pb.ProposeBatch, pb.VerifyBatch);
        method: the unary method a call stands for, as the observer names it ("/specserve.v1.TargetService/Verify")."""
        self.address, self.open_stream, self.batch_type = address, open_stream, batch_type
        self.method, self.observe = method, observe
        self.num_streams = 0
        """Streams opened so far: one, unless a stream ended (its worker failed or went away)."""
        self._stream: _Stream | None = None
        self._call_ids = itertools.count(1)

    async def call(
        self, session_id: str, request: Message, timeout_s: float, on_partial: Callable[[Any], None] | None = None
    ) -> Any:
        """The response to `request` (one of the session's rounds); raises AioRpcError, DEADLINE_EXCEEDED after
        timeout_s without a result. A call cancelled or past its deadline is cancelled on the worker unless it
        already began. `on_partial(response)`: each partial result (a run's tokens as they are decoded), which
        also gives the call timeout_s again."""
        started, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            return await self._exchange(request, timeout_s, on_partial)
        except grpc.aio.UsageError as error:  # the pool closed the channel: as a dead worker, so callers move on
            code = grpc.StatusCode.UNAVAILABLE
            raise _rpc_error(code, f"{self.address}: {error}") from error
        except grpc.aio.AioRpcError as error:
            code = error.code()
            raise _rpc_error(code, f"{self.address}: {error.details()}") from error
        except BaseException:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            if self.observe is not None:
                self.observe(self.method, code, time.perf_counter() - started)

    async def _exchange(self, request: Message, timeout_s: float, on_partial: Callable[[Any], None] | None) -> Any:
        stream = self._stream
        if stream is None or stream.ended:
            stream = self._stream = _Stream(self.open_stream(), self.batch_type)
            self.num_streams += 1
        call_id = next(self._call_ids)
        future = stream.send(call_id, request, current_request_id() or "")
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                if on_partial is not None:

                    def alive(response: Any) -> None:
                        deadline.reschedule(asyncio.get_running_loop().time() + timeout_s)
                        on_partial(response)

                    stream.partials[call_id] = alive
                return await future
        except TimeoutError:
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"no response within {timeout_s:.1f}s") from None
        finally:
            stream.give_up(call_id)  # unless answered: its late result is dropped

    def close_all(self) -> None:
        """The channel closes: the stream ends, and the calls waiting on it fail UNAVAILABLE."""
        if self._stream is not None:
            self._stream.end(_rpc_error(grpc.StatusCode.UNAVAILABLE, "the channel to the worker closed"), cancel=False)
            self._stream = None

    def __len__(self) -> int:
        """Calls waiting for their results."""
        return 0 if self._stream is None else len(self._stream.pending)


class _Stream:
    """One open stream: its calls waiting for results, and the messages not sent yet."""

    def __init__(self, call: grpc.aio.StreamStreamCall, batch_type: Any) -> None:
        self.call, self.batch_type = call, batch_type
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.partials: dict[int, Callable[[Any], None]] = {}  # by call id: who hears its partial results
        self.ended = False
        self._outbox: list[list[Any]] = []  # [message, bytes]: sent in order; calls join the last one
        self._wake = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._write())]

    def send(self, call_id: int, request: Message, request_id: str) -> asyncio.Future[Any]:
        """Queue the call for the next message (sent once this loop iteration's calls have joined it)."""
        size = request.ByteSize() + len(request_id) + 32  # with the call id and the framing
        if size > MAX_MESSAGE_BYTES:  # alone it would end the stream: fail it as gRPC fails a unary call
            raise _rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"a {size}-byte call, over the message limit")
        message = self._next_message(size)
        message.calls.add(call_id=call_id, request=request, request_id=request_id)
        future = self.pending[call_id] = asyncio.get_running_loop().create_future()
        return future

    def give_up(self, call_id: int) -> None:
        """The caller is done with the call: if it still waits for a result, the worker is told to drop it."""
        self.partials.pop(call_id, None)
        if self.pending.pop(call_id, None) is not None and not self.ended:
            self._next_message(8).cancelled_call_ids.append(call_id)

    def end(self, error: grpc.aio.AioRpcError, cancel: bool = True) -> None:
        """No more calls: those waiting fail with `error`. Without `cancel` the worker is told that no more come
        (it ends the stream OK once the calls it runs are done), else the stream is cancelled."""
        if self.ended:
            return
        self.ended = True
        pending, self.pending, self._outbox = self.pending, {}, []
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        reader, writer = self._tasks
        current = asyncio.current_task()
        if writer is not current:
            writer.cancel()
        if not cancel:
            asyncio.ensure_future(self._done_writing())
            return
        if reader is not current:
            reader.cancel()
        self.call.cancel()

    async def _done_writing(self) -> None:
        try:
            await self.call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):  # it had ended anyway
            pass

    def _next_message(self, size: int) -> Any:
        if not self._outbox or (self._outbox[-1][1] + size > BATCH_MESSAGE_BYTES and self._outbox[-1][1] > 0):
            self._outbox.append([self.batch_type(), 0])
        self._outbox[-1][1] += size
        self._wake.set()
        return self._outbox[-1][0]

    async def _write(self) -> None:
        """Waking in the loop iteration after the first call queued, the calls made meanwhile go in one message."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    message, _ = self._outbox.pop(0)
                    await self.call.write(message)
        except grpc.aio.AioRpcError as error:
            self.end(_stream_error(error.code(), error.details()))
        except (asyncio.InvalidStateError, grpc.aio.UsageError):  # the stream had ended with a status
            self.end(await self._ended())

    async def _read(self) -> None:
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                # only VerifyResults carry partial results (a run's tokens ahead of its last result)
                partials = "partial" in message.DESCRIPTOR.nested_types_by_name["Result"].fields_by_name
                for result in message.results:
                    if partials and result.partial:
                        self._partial(result)
                        continue
                    future = self.pending.pop(result.call_id, None)
                    if future is None or future.done():  # given up on: dropped
                        continue
                    if result.HasField("error"):
                        code = _CODES.get(result.error.code, grpc.StatusCode.UNKNOWN)
                        future.set_exception(_rpc_error(code, result.error.details))
                    else:
                        future.set_result(result.response)
            self.end(await self._ended())
        except grpc.aio.AioRpcError as error:
            self.end(_stream_error(error.code(), error.details()))
        except asyncio.CancelledError:
            self.end(_rpc_error(grpc.StatusCode.UNAVAILABLE, "the round stream was cancelled"))
            raise
        except Exception as error:  # noqa: BLE001 - a stream that cannot be read is as a dead worker
            self.end(_rpc_error(grpc.StatusCode.UNAVAILABLE, f"the round stream failed: {error!r}"))

    def _partial(self, result: Any) -> None:
        """A partial result goes to its caller; one the caller cannot take fails its call, not the stream."""
        future, hear = self.pending.get(result.call_id), self.partials.get(result.call_id)
        if future is None or future.done() or hear is None:
            return
        try:
            hear(result.response)
        except Exception as error:  # noqa: BLE001 - the caller's own fault, its call's failure
            future.set_exception(error)

    async def _ended(self) -> grpc.aio.AioRpcError:
        return _stream_error(await self.call.code(), await self.call.details())


def _stream_error(code: grpc.StatusCode, details: str | None) -> grpc.aio.AioRpcError:
    """What the calls of an ended stream fail with: its status, unless it ended OK or cancelled (a worker that
    stopped answering or is stopping), which is as if the worker had gone away."""
    if code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
        return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the worker ended the round stream ({code.name}: {details})")
    return _rpc_error(code, details)


def _rpc_error(code: grpc.StatusCode, details: str | None) -> grpc.aio.AioRpcError:
    no_metadata = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, no_metadata, no_metadata, details)
