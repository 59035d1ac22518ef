"""Fault injection for the served stack: gRPC server interceptors handed to a worker's serve() (see
LocalStack's `interceptors`). They delay or fail chosen calls on the real server; nothing is mocked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from protos import specserve_pb2 as pb
from specserve.rpc import MalformedRequest


class Fault(grpc.aio.ServerInterceptor):
    """Acts on calls to `method` (e.g. "Propose", "Verify"): the first `skip` pass untouched, then the next
    `times` (None: all) get `act(context)` before the real handler runs (if `act` returns)."""

    def __init__(self, method: str, skip: int = 0, times: int | None = None) -> None:
        self.method, self.skip, self.times = method, skip, times
        self.num_calls = 0
        self.num_injected = 0
        self._lock = threading.Lock()

    async def act(self, context: grpc.aio.ServicerContext) -> None:
        raise NotImplementedError

    def _take(self) -> bool:
        with self._lock:  # one instance may serve several servers (e.g. "the first Verify anywhere")
            self.num_calls += 1
            if self.num_calls <= self.skip or (self.times is not None and self.num_injected >= self.times):
                return False
            self.num_injected += 1
            return True

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        if details.method.endswith("/" + self.method) and handler.unary_unary is not None:
            return self._unary(handler)
        if details.method.endswith(f"/{self.method}Stream") and handler.stream_stream is not None:
            return self._per_message(handler)  # a session's round calls as messages of one stream
        if details.method.endswith(f"/{self.method}Rounds") and handler.stream_stream is not None:
            return self._per_call(handler)  # every session's round calls, many to a message
        return handler

    def _unary(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary

        async def faulty(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self._take():
                await self.act(context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            faulty, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )

    def _per_message(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """Each message of the stream counts as a call, acted on before the handler sees it."""
        inner = handler.stream_stream

        async def faulty(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async def acted_on() -> AsyncIterator[Any]:
                async for request in requests:
                    if self._take():
                        await self.act(context)
                    yield request

            async for response in inner(acted_on(), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(
            faulty, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


    def _per_call(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """Each call of a message counts: one acted on is held back from the handler until `act` returns
        (answered with the error it aborts with, if it does), while the message's other calls go on. A held
        call that its caller cancels is dropped, as the worker drops a call it has not begun."""
        inner = handler.stream_stream

        async def faulty(batches: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            to_inner: asyncio.Queue[Any] = asyncio.Queue()
            out: asyncio.Queue[Any] = asyncio.Queue()
            held: dict[int, asyncio.Task[None]] = {}

            async def act_on(call: Any, batch_type: Any) -> None:
                try:
                    await self.act(_CallContext())
                except _Aborted as aborted:
                    results = getattr(pb, batch_type.__name__.replace("Batch", "Results"))()
                    error = pb.RoundError(code=aborted.code.value[0], details=aborted.details)
                    results.results.add(call_id=call.call_id, error=error)
                    out.put_nowait(results)
                else:
                    to_inner.put_nowait(batch_type(calls=[call]))
                finally:
                    held.pop(call.call_id, None)

            async def split() -> None:
                async for batch in batches:
                    if isinstance(batch, MalformedRequest):
                        to_inner.put_nowait(batch)
                        continue
                    for call_id in batch.cancelled_call_ids:
                        if (task := held.pop(call_id, None)) is not None:
                            task.cancel()
                    passed = type(batch)(cancelled_call_ids=batch.cancelled_call_ids)
                    for call in batch.calls:
                        if self._take():
                            held[call.call_id] = asyncio.ensure_future(act_on(call, type(batch)))
                        else:
                            passed.calls.append(call)
                    to_inner.put_nowait(passed)
                await asyncio.gather(*held.values(), return_exceptions=True)
                to_inner.put_nowait(_END)

            async def requests() -> AsyncIterator[Any]:
                while (batch := await to_inner.get()) is not _END:
                    yield batch

            async def pump() -> None:
                try:
                    async for results in inner(requests(), context):
                        out.put_nowait(results)
                finally:
                    out.put_nowait(_END)

            splitting, pumping = asyncio.ensure_future(split()), asyncio.ensure_future(pump())
            try:
                while (results := await out.get()) is not _END:
                    yield results
                pumping.result()  # the handler's own end, an abort included
            finally:
                for task in (splitting, pumping, *held.values()):
                    task.cancel()

        return grpc.stream_stream_rpc_method_handler(
            faulty, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


_END = object()


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _CallContext:
    """What `act` gets for one call of a round stream: aborting fails only that call."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details)


class Delay(Fault):
    """The call answers `seconds` late (a slow or overloaded worker)."""

    def __init__(self, method: str, seconds: float, skip: int = 0, times: int | None = None) -> None:
        super().__init__(method, skip, times)
        self.seconds = seconds

    async def act(self, context: grpc.aio.ServicerContext) -> None:
        await asyncio.sleep(self.seconds)


class Fail(Fault):
    """The call fails with `code` instead of running (a worker error mid-request)."""

    def __init__(self, method: str, code: grpc.StatusCode, skip: int = 0, times: int | None = None) -> None:
        super().__init__(method, skip, times)
        self.code = code

    async def act(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(self.code, f"injected fault: {self.code.name}")
