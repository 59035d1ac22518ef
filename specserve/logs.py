"""Structured logs and request ids: one id per request, carried to the workers in the gRPC metadata key
`x-request-id`, stamped on every log record of all three services; text or one JSON object per line
(`--log-format json`, or SPECSERVE_LOG_FORMAT=json for processes started without the flag)."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

METADATA_KEY = "x-request-id"
LOG_FORMAT_ENV = "SPECSERVE_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "request_id"}
# One line per public call and per session start/end at INFO; the per-round calls only at DEBUG.
_INFO_METHODS = ("Generate", "GenerateStream", "Prefill", "Release", "Scale")
MAX_REQUEST_ID_CHARS = 128


def new_request_id() -> str:
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    return _request_id.get()


def bind_request_id(request_id: str | None) -> str:
    """Make `request_id` (a fresh one when None or unusable) this task's request id and return it."""
    if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS or not request_id.isprintable():
        request_id = new_request_id()
    _request_id.set(request_id)
    return request_id


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the task that logged it (None outside requests)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, extra fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if request_id := getattr(record, "request_id", None):
            entry["request_id"] = request_id
        entry |= {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{text} [request {request_id}]" if request_id else text


def configure_logging(level: int = logging.INFO, log_format: str | None = None) -> None:
    """Log to stderr, replacing any handlers, with request ids; `log_format` None reads SPECSERVE_LOG_FORMAT."""
    log_format = log_format or os.environ.get(LOG_FORMAT_ENV) or "text"
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


# ---------------------------------------------------------------------------------------------------
# gRPC: the id travels in the metadata


class RequestIdServerInterceptor(grpc.aio.ServerInterceptor):
    """Binds the caller's x-request-id (a new one when absent) for specserve methods and logs each call
    with its status and duration, under that id."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:  # fmt: skip
        handler = await continuation(details)
        if handler is None or not details.method.startswith("/specserve."):
            return handler
        given = next((v for k, v in details.invocation_metadata or () if k == METADATA_KEY), None)
        given = given.decode(errors="replace") if isinstance(given, bytes) else given
        return _traced(handler, details.method, given)


_calls_logger = logging.getLogger("specserve.rpc.calls")


def log_call(method: str, code_name: str, started: float) -> None:
    """The line for a served call (`method`: "/specserve.v1.TargetService/Verify"), under this task's request
    id: INFO for a public call or a session's start or end, DEBUG for a round, WARNING for any that failed."""
    level = logging.INFO if method.rsplit("/", 1)[-1] in _INFO_METHODS else logging.DEBUG
    level_now = level if code_name == "OK" else logging.WARNING
    if not _calls_logger.isEnabledFor(level_now):  # a round's line, at every round of every session
        return
    ms = (time.perf_counter() - started) * 1000
    extra = {"request_id": _request_id.get(), "rpc_method": method, "rpc_code": code_name, "duration_ms": ms}
    _calls_logger.log(level_now, "%s %s in %.1f ms", method, code_name, ms, extra=extra)


def _traced(handler: grpc.RpcMethodHandler, method: str, given: str | None) -> grpc.RpcMethodHandler:
    def done(context: grpc.aio.ServicerContext, started: float, error: BaseException | None) -> None:
        code = context.code() if error is None or isinstance(error, grpc.aio.AbortError) else None
        code_name = code.name if isinstance(code, grpc.StatusCode) else "OK" if error is None else type(error).__name__
        log_call(method, code_name, started)

    def traced_stream(behaviour: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]) -> Any:
        """A response stream (to one request or to a stream of them): one line at its end."""

        async def stream(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            bind_request_id(given)
            started, error = time.perf_counter(), None
            try:
                async for item in behaviour(requests, context):
                    yield item
            except BaseException as e:
                error = e
                raise
            finally:
                done(context, started, error)

        return stream

    if handler.response_streaming and not handler.request_streaming:
        return handler._replace(unary_stream=traced_stream(handler.unary_stream))
    if not handler.response_streaming and not handler.request_streaming:
        behaviour = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            bind_request_id(given)
            started, error = time.perf_counter(), None
            try:
                return await behaviour(request, context)
            except BaseException as e:
                error = e
                raise
            finally:
                done(context, started, error)

        return handler._replace(unary_unary=unary)
    if handler.response_streaming and handler.request_streaming:  # round calls: each logs its own line too
        return handler._replace(stream_stream=traced_stream(handler.stream_stream))
    return handler  # specserve has no client-streaming methods with a unary response


RpcObserver = Callable[[str, grpc.StatusCode, float], None]
"""Told (method, status code, seconds) after every internal call."""


class RequestIdClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Sends the current request id with every internal call; reports each call's outcome and duration."""

    def __init__(self, observe: RpcObserver | None = None) -> None:
        self.observe = observe

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        request_id = _request_id.get()
        if request_id is not None:
            details = details._replace(metadata=[*(details.metadata or ()), (METADATA_KEY, request_id)])
        started = time.perf_counter()
        call = await continuation(details, request)
        if self.observe is not None:
            code = await call.code()  # waits for the call to end; the caller still gets its result or error
            method = details.method.decode() if isinstance(details.method, bytes) else details.method
            self.observe(method, code, time.perf_counter() - started)
        return call
