"""Fault injection for the served stack: gRPC server interceptors handed to a worker's serve() (see
LocalStack's `interceptors`). They delay or fail chosen calls on the real server; nothing is mocked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


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
