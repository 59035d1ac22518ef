"""gRPC plumbing shared by the three servers: one exception -> status mapping, health, reflection,
message-size limits, graceful stop. Knows grpc, not the specserve protos."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specserve.logs import RequestIdServerInterceptor
from specserve.models.tokenizers import TokenizerMismatchError
from specserve.openmp import release_idle_threads
from specserve.security import TLSConfig, server_interceptors
from specserve.sessions import SessionNotFoundError

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 8 << 20  # a round's payload is O(k); anything near this is an error or an attack
MAX_STATUS_MESSAGE_CHARS = 1000  # error messages may quote the request (a session id, a stop string)
T = TypeVar("T")
C = TypeVar("C")
R = TypeVar("R")


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
    if isinstance(error, OverloadedError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, UnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, grpc.aio.AioRpcError):  # an internal call failed: say which way
        transient = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
        return grpc.StatusCode.UNAVAILABLE if error.code() in transient else grpc.StatusCode.INTERNAL
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    code = status_for(error)
    if code == grpc.StatusCode.INTERNAL:
        logger.exception("%s failed", method)  # unexpected: keep the traceback
    if isinstance(error, grpc.aio.AioRpcError):
        message = f"an internal service failed: {error.code().name}: {error.details()}"
    else:
        message = str(error) or type(error).__name__
    if len(message) > MAX_STATUS_MESSAGE_CHARS:  # it travels as a header: past 8 KiB the caller sees only
        message = message[: MAX_STATUS_MESSAGE_CHARS - 20] + "... (message cut)"  # RESOURCE_EXHAUSTED
    trailing: tuple[tuple[str, str], ...] = ()
    if isinstance(error, OverloadedError) and error.retry_after_s is not None:
        trailing = (("retry-after-ms", str(max(1, round(1000 * error.retry_after_s)))),)
    await context.abort(code, message, trailing_metadata=trailing)


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """What the tolerant deserializer hands a handler instead of raising: gRPC would answer UNKNOWN."""

    reason: str


def _check_parsed(request: Any) -> None:
    if isinstance(request, MalformedRequest):
        raise ValueError(f"malformed request: {request.reason}")


def unary_errors(handler: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Turn exceptions raised by a unary handler into the mapped status, with the message."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            _check_parsed(request)
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
            _check_parsed(request)
            async for item in handler(self, request, context):
                yield item
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as error:  # noqa: BLE001
            await _abort(context, error, handler.__qualname__)

    return wrapper


class ModelExecutor:
    """Runs model calls on one thread: the model is busy with one pass at a time, and the event loop
    stays free for other RPCs meanwhile. All of a worker's torch compute belongs here, its load included
    (see serve_worker).

    Two classes of call take turns when both wait: passes (the batched Verify or Propose of the sessions
    under way) and background work (prompt chunks of new requests). First come, first served, a burst of
    new requests held the sessions' passes behind every prompt queued before them: at 16 clients on two
    cores 16 prefills of 2.5 s each came first, a session's Verify waited 30 s, hit its deadline and the
    replica was taken for failed (its sessions rebuilt by more prefills). Taking turns, a pass waits for
    at most one prompt chunk, and a prompt chunk for at most one pass."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._busy = False
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
        """On the model thread, queued once the model is free: an idle model frees the cores
        (specserve/openmp.py). Queued after the result went back, so no caller waits for the pause (3.5 ms
        of every round on a busy two-core host); a call that took the model meanwhile keeps its team."""
        if not self._busy:
            release_idle_threads()

    async def timed(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """(result, seconds the call computed), the queueing before it excluded."""

        def call() -> tuple[T, float]:
            started = time.perf_counter()
            return fn(*args), time.perf_counter() - started

        return await self.run(call)

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

    def _release(self) -> None:
        """The model is free: the next call, the other class first when both wait."""
        order = (not self._last_background, self._last_background)
        for background in order:
            while self._waiting[background]:
                granted = self._waiting[background].popleft()
                if not granted.done():
                    granted.set_result(None)
                    return
        self._busy = False
        try:
            self._pool.submit(self._pause_if_idle)
        except RuntimeError:  # shut down: no pass comes again
            pass

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


GATHER_FRACTION = 0.2  # of the last pass's time: how long a pass may wait for sessions expected back
MAX_GATHER_S = 0.05


class BatchQueue(Generic[C, R]):
    """Continuous batching: calls that arrive while the model is busy run together in its next pass.

    Whatever queued during a pass (up to `max_batch_size`, one call per session) forms the next batch.
    A lone call on an idle model runs at once. Only when sessions of the previous pass are not back yet
    does a pass wait for them, briefly (a fifth of the last pass, at most 50 ms): without that, two
    sessions whose calls arrive a round trip apart alternate passes forever instead of sharing them.
    """

    def __init__(
        self,
        executor: ModelExecutor,
        run_batch: Callable[[list[C]], list[R | Exception]],
        session_of: Callable[[C], str],
        max_batch_size: int,
    ) -> None:
        self.executor, self.run_batch, self.session_of = executor, run_batch, session_of
        self.max_batch_size = max_batch_size
        self._waiting: list[tuple[C, asyncio.Future[tuple[R, float, list[C]]]]] = []
        self._running = False
        self._arrived = asyncio.Event()
        self._last_sessions: set[str] = set()
        self._last_pass_s = 0.0

    async def submit(self, call: C) -> tuple[R, float, list[C]]:
        """(result, seconds the batch computed, the calls that shared it); raises the call's own error."""
        future: asyncio.Future[tuple[R, float, list[C]]] = asyncio.get_running_loop().create_future()
        self._waiting.append((call, future))
        self._arrived.set()
        if not self._running:
            self._running = True
            asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                await self._gather()
                batch = self._take_batch()
                calls = [call for call, _ in batch]
                try:
                    results, seconds = await self.executor.timed(self.run_batch, calls)
                except Exception as error:  # noqa: BLE001 - the whole pass failed: every call in it hears why
                    results, seconds = [error] * len(batch), 0.0
                self._last_sessions, self._last_pass_s = {self.session_of(c) for c in calls}, seconds
                for (_, future), result in zip(batch, results):
                    if future.done():  # the caller went away
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result((result, seconds, calls))
        finally:
            self._running = False

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(MAX_GATHER_S, GATHER_FRACTION * self._last_pass_s)
        while len(self._waiting) < self.max_batch_size:
            if not self._last_sessions - {self.session_of(call) for call, _ in self._waiting}:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            except TimeoutError:
                return

    def _take_batch(self) -> list[tuple[C, asyncio.Future[tuple[R, float, list[C]]]]]:
        batch, rest, sessions = [], [], set()
        for item in self._waiting:
            session = self.session_of(item[0])
            if len(batch) < self.max_batch_size and session not in sessions and not item[1].done():
                batch.append(item)
                sessions.add(session)
            elif not item[1].done():
                rest.append(item)
        self._waiting = rest
        return batch


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


class WorkerServicer:
    """Base of the draft and target servicers: the worker arrives once its model has loaded."""

    executor_name = "model"

    def __init__(self) -> None:
        self.executor = ModelExecutor(self.executor_name)
        self._worker: Any = None
        self.stopping = False
        """The server is stopping: as it refuses new calls, a session's round stream refuses its next round."""

    def attach(self, worker: Any) -> None:
        self._worker = worker

    @property
    def worker(self) -> Any:
        if self._worker is None:
            raise UnavailableError("the model is still loading; retry shortly")
        return self._worker


async def serve_worker(
    servicer: WorkerServicer,
    service: ServiceDescriptor,
    make_worker: Callable[[], Any],
    host: str,
    port: int,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    evict_every_s: float = 10.0,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    tls: TLSConfig | None = None,
    on_serving: Callable[[], None] | None = None,
) -> None:
    """Listen at once (health NOT_SERVING), load the model, serve until `stop` is set, then drain.
    on_listening gets the address once bound; on_serving is called once the model is loaded."""
    service_name = service.full_name
    server = Server([service_name], interceptors=interceptors, tls=tls)
    add_service(server.server, servicer, service)
    address = server.bind(host, port)
    await server.start()
    logger.info("%s listening on %s (loading the model)", service_name, address)
    if on_listening is not None:
        on_listening(address)
    stop = stop or asyncio.Event()
    try:
        # on the model's own thread: with OpenMP (torch's CPU threads), every thread that runs parallel work
        # gets a team of its own, and more team threads than cores make libgomp stop spin-waiting between
        # parallel regions. A load on another thread slowed each later pass by 12-30% here (a futex
        # wake-up per region, ~800 per pass).
        worker = await servicer.executor.run(make_worker)
        servicer.attach(worker)
        await server.set_serving()
        logger.info("%s serving on %s", service_name, address)
        if on_serving is not None:
            on_serving()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), evict_every_s)
            except TimeoutError:
                evicted = worker.sessions.evict_idle()
                if evicted:
                    logger.info("evicted %d idle sessions", len(evicted))
    finally:
        servicer.stopping = True
        await server.stop()
        servicer.executor.shutdown()
