"""A session's round calls (Propose or Verify) on one bidirectional stream to its worker: a round costs a
message each way instead of a unary call's set-up, headers and deadline. Failures look like a unary
call's: an AioRpcError with the worker's status, so failover and retries are the same."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from specserve.logs import METADATA_KEY, RpcObserver, current_request_id


class RoundStream:
    """One session's open stream. Calls take turns (a session's rounds are sequential anyway); any failure,
    timeout or cancellation ends the stream, and the next call opens a new one (RoundStreams)."""

    def __init__(self, open_stream: Callable[..., Any], method: str) -> None:
        """open_stream: the stub's stream-stream method; method: the unary method a message stands for, as
        the observer names it ("/specserve.v1.TargetService/Verify")."""
        request_id = current_request_id()
        metadata = ((METADATA_KEY, request_id),) if request_id is not None else ()
        self.call: grpc.aio.StreamStreamCall = open_stream(metadata=metadata)
        self.method = method
        self._turn = asyncio.Lock()  # a response belongs to whoever sent the request just before it

    async def exchange(self, request: Message, timeout_s: float) -> Any:
        """Send one request, return its response; raises AioRpcError (DEADLINE_EXCEEDED after timeout_s)."""
        try:
            async with self._turn, asyncio.timeout(timeout_s):
                await self.call.write(request)
                response = await self.call.read()
        except TimeoutError:
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"no response within {timeout_s:.1f}s") from None
        except asyncio.InvalidStateError as error:  # the stream had ended: its status says why
            raise await self._ended() from error
        if response is grpc.aio.EOF:  # the worker ended the stream without an error status
            raise await self._ended()
        return response

    async def _ended(self) -> grpc.aio.AioRpcError:
        code = await self.call.code()
        if code == grpc.StatusCode.OK:  # a server that stopped answering: as if it had gone away
            return _rpc_error(grpc.StatusCode.UNAVAILABLE, "the worker ended the session's round stream")
        return _rpc_error(code, await self.call.details())

    def cancel(self) -> None:
        self.call.cancel()

    async def finish(self) -> None:
        """End the stream from this side, so the worker ends it OK (a cancelled stream reads as a failure)."""
        try:
            await self.call.done_writing()
        except (grpc.aio.UsageError, asyncio.InvalidStateError):  # already ended
            pass


class RoundStreams:
    """A worker client's open round streams, one per session; a failed or cancelled call drops its stream."""

    def __init__(
        self, address: str, open_stream: Callable[..., Any], method: str, observe: RpcObserver | None
    ) -> None:
        """address: the worker's, named in every error (as the unary calls name it)."""
        self.address, self.open_stream, self.method, self.observe = address, open_stream, method, observe
        self._streams: dict[str, RoundStream] = {}

    async def call(self, session_id: str, request: Message, timeout_s: float) -> Any:
        """The response to `request` on the session's stream (opened now if it has none)."""
        started, code = time.perf_counter(), grpc.StatusCode.OK
        stream = self._streams.get(session_id)
        try:
            if stream is None:
                stream = self._streams[session_id] = RoundStream(self.open_stream, self.method)
            return await stream.exchange(request, timeout_s)
        except grpc.aio.UsageError as error:  # the pool closed the channel: as a dead worker, so callers move on
            code = grpc.StatusCode.UNAVAILABLE
            self._drop(session_id, stream)
            raise _rpc_error(code, f"{self.address}: {error}") from error
        except grpc.aio.AioRpcError as error:
            code = error.code()
            self._drop(session_id, stream)
            raise _rpc_error(code, f"{self.address}: {error.details()}", error.trailing_metadata()) from error
        except BaseException:  # cancelled mid-call: a response may still come, for a request nobody awaits
            code = grpc.StatusCode.CANCELLED
            self._drop(session_id, stream)
            raise
        finally:
            if self.observe is not None:
                self.observe(self.method, code, time.perf_counter() - started)

    async def close(self, session_id: str) -> None:
        """The session has ended (released): its stream too."""
        stream = self._streams.pop(session_id, None)
        if stream is not None:
            await stream.finish()

    def close_all(self) -> None:
        """The channel closes: every stream is cancelled."""
        for stream in self._streams.values():
            stream.cancel()
        self._streams.clear()

    def __len__(self) -> int:
        return len(self._streams)

    def _drop(self, session_id: str, stream: RoundStream | None) -> None:
        if stream is None:
            return
        if self._streams.get(session_id) is stream:
            del self._streams[session_id]
        stream.cancel()


def _rpc_error(
    code: grpc.StatusCode, details: str | None, trailing: grpc.aio.Metadata | None = None
) -> grpc.aio.AioRpcError:
    no_metadata = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, no_metadata, trailing or no_metadata, details)
