"""gRPC transport shared by the three servers: one exception -> status mapping, health, reflection,
message-size limits, graceful stop, interceptors. Knows grpc, not the specserve protos nor any model
(the model thread and batching are the worker runtime's: specserve/worker/)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specserve.logs import RequestIdServerInterceptor
from specserve.models.tokenizers import TokenizerMismatchError
from specserve.security import TLSConfig, server_interceptors
from specserve.worker.sessions import SessionNotFoundError

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 8 << 20  # a round's payload is O(k); anything near this is an error or an attack
BATCH_MESSAGE_BYTES = MAX_MESSAGE_BYTES // 2  # a round stream's message: calls or results up to this, or one
MAX_STATUS_MESSAGE_CHARS = 1000  # error messages may quote the request (a session id, a stop string)
T = TypeVar("T")


class OverloadedError(RuntimeError):
    """The server is at capacity; the caller should retry later (after `retry_after_s` when given, which
    the client also gets as the trailing metadata `retry-after-ms`)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(RuntimeError):
    """The server cannot answer yet (model loading) or any more (shutting down)."""


class PreconditionError(RuntimeError):
    """The request is valid but this deployment cannot carry it out (e.g. scaling fixed addresses)."""


def status_for(error: BaseException) -> grpc.StatusCode:
    """The one mapping from exceptions to status codes."""
    if isinstance(error, SessionNotFoundError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, (TokenizerMismatchError, PreconditionError)):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, (ValueError, UnicodeError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, (OverloadedError, MemoryError)):  # MemoryError: e.g. llama.cpp's KV cache is full
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, UnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, grpc.aio.AioRpcError):  # an internal call failed: say which way
        transient = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
        return grpc.StatusCode.UNAVAILABLE if error.code() in transient else grpc.StatusCode.INTERNAL
    return grpc.StatusCode.INTERNAL


def error_status(error: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The status a handler's error answers and its message (cut to MAX_STATUS_MESSAGE_CHARS); the
    unexpected (INTERNAL) is logged with its traceback, from within the `except` that caught it."""
    code = status_for(error)
    if code == grpc.StatusCode.INTERNAL:
        logger.exception("%s failed", method)  # unexpected: keep the traceback
    if isinstance(error, grpc.aio.AioRpcError):
        message = f"an internal service failed: {error.code().name}: {error.details()}"
    else:
        message = str(error) or type(error).__name__
    if len(message) > MAX_STATUS_MESSAGE_CHARS:  # it travels as a header: past 8 KiB the caller sees only
        message = message[: MAX_STATUS_MESSAGE_CHARS - 20] + "... (message cut)"  # RESOURCE_EXHAUSTED
    return code, message


async def _abort(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    code, message = error_status(error, method)
    trailing: tuple[tuple[str, str], ...] = ()
    if isinstance(error, OverloadedError) and error.retry_after_s is not None:
        trailing = (("retry-after-ms", str(max(1, round(1000 * error.retry_after_s)))),)
    await context.abort(code, message, trailing_metadata=trailing)


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """What the tolerant deserializer hands a handler instead of raising: gRPC would answer UNKNOWN."""

    reason: str


def check_parsed(request: Any) -> None:
    if isinstance(request, MalformedRequest):
        raise ValueError(f"malformed request: {request.reason}")


def unary_errors(handler: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Turn exceptions raised by a unary handler into the mapped status, with the message."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            check_parsed(request)
            return await handler(self, request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as error:  # noqa: BLE001 - mapped to a status, never lost
            await _abort(context, error, handler.__qualname__)
            raise AssertionError("unreachable: abort raises") from error

    return wrapper


def stream_errors(handler: Callable[..., AsyncIterator[T]]) -> Callable[..., AsyncIterator[T]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[T]:
        try:
            check_parsed(request)
            async for item in handler(self, request, context):
                yield item
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as error:  # noqa: BLE001
            await _abort(context, error, handler.__qualname__)

    return wrapper


def add_service(server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor) -> None:
    """Register `servicer`'s methods for `service` like the generated add_*_to_server, except that a
    request that does not parse (bad UTF-8, garbage) reaches the handler as MalformedRequest, so it
    is answered INVALID_ARGUMENT with the reason."""
    handlers = {}
    for method in service.methods:
        parse = GetMessageClass(method.input_type).FromString
        serialize = GetMessageClass(method.output_type).SerializeToString
        kind = _handler_kind(method.client_streaming, method.server_streaming)
        handlers[method.name] = kind(
            getattr(servicer, method.name), request_deserializer=_tolerant(parse), response_serializer=serialize
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def _handler_kind(client_streaming: bool, server_streaming: bool) -> Callable[..., grpc.RpcMethodHandler]:
    if client_streaming:
        if not server_streaming:
            raise ValueError("specserve has no client-streaming methods with a unary response")
        return grpc.stream_stream_rpc_method_handler
    return grpc.unary_stream_rpc_method_handler if server_streaming else grpc.unary_unary_rpc_method_handler


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as error:
            return MalformedRequest(str(error))

    return deserialize


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),  # a port already taken is an error, not a port two servers share
    ]


class Server:
    """A grpc.aio server with health (NOT_SERVING until `set_serving`) and reflection."""

    def __init__(
        self,
        service_names: Sequence[str],
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: TLSConfig | None = None,
        api_key: str | None = None,
    ) -> None:
        """tls: serve over TLS (mutual when it requires client certificates); api_key: every call but
        health must carry it as a bearer token. Both checks run before `interceptors`."""
        self.tls = tls
        interceptors = [*server_interceptors(tls, api_key), RequestIdServerInterceptor(), *interceptors]
        self.server = grpc.aio.server(options=server_options(max_message_bytes), interceptors=interceptors)
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port = 0

    def bind(self, host: str, port: int) -> str:
        if self.tls is None:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        else:
            self.port = self.server.add_secure_port(f"{host}:{port}", self.tls.server_credentials())
        if self.port == 0:
            raise OSError(f"could not listen on {host}:{port}")
        return f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def set_serving(self) -> None:
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)

    async def _set_all(self, status: int) -> None:
        for name in ["", *self.service_names]:
            result = self.health.set(name, status)
            if asyncio.iscoroutine(result):
                await result
