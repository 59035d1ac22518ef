"""TLS for every gRPC hop (mutual between the orchestrator and the workers), bearer-token authentication
of the public API, and the one place the API key is read from the environment."""

from __future__ import annotations

import hmac
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

API_KEY_ENV = "SPECSERVE_API_KEY"
ORCHESTRATOR_NAME = "specserve-orchestrator"
"""The name on the orchestrator's client certificate; workers under mutual TLS admit only it."""
WORKER_NAME = "specserve-worker"
"""The name on the workers' certificates, checked by the orchestrator whatever address a worker has."""
OPEN_METHODS = ("/grpc.health.v1.Health/",)
"""Answered without a token or a peer check: load balancers and probes carry neither."""


class SecurityConfigError(ValueError):
    """A TLS file is missing or unreadable, or the settings contradict each other."""


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """One process's side of TLS connections: what it presents and whom it trusts."""

    cert: str | None = None
    """PEM certificate (chain) this process presents: required to serve; as a client, for mutual TLS."""
    key: str | None = None
    """PEM private key of `cert`."""
    ca: str | None = None
    """PEM CA bundle peers must chain to. Servers verify client certificates with it; clients verify the
    server with it (None: the system's roots)."""
    require_client_auth: bool = False
    """Serving: refuse callers that present no certificate signed by `ca` (mutual TLS)."""
    allowed_peers: tuple[str, ...] = ()
    """Serving with require_client_auth: admit only client certificates naming one of these (CN or DNS
    SAN); other callers get PERMISSION_DENIED. Empty: any certificate `ca` signed."""
    server_name: str | None = None
    """As a client: the name the server's certificate must carry, when not the host of the address (the
    workers listen on whatever address their node has; their certificates say specserve-worker)."""

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError(f"give both cert and key or neither, got cert={self.cert!r} key={self.key!r}")
        if self.require_client_auth and self.ca is None:
            raise SecurityConfigError("require_client_auth needs ca: the CA that signs the client certificates")
        if self.allowed_peers and not self.require_client_auth:
            raise SecurityConfigError("allowed_peers needs require_client_auth: without it peers show no name")
        object.__setattr__(self, "allowed_peers", tuple(self.allowed_peers))

    @classmethod
    def from_dir(cls, directory: str | Path, role: str) -> TLSConfig:
        """The settings of `role` from a folder that `specserve certs` wrote.

        role: `worker` (serves with mutual TLS, admits only the orchestrator), `orchestrator-public` (serves
        the public API, no client certificates), `orchestrator-client` (calls the workers), `client` (a
        caller of the public API: trusts the CA)."""
        d = Path(directory)
        if role == "worker":
            return cls(str(d / "worker.pem"), str(d / "worker-key.pem"), str(d / "ca.pem"), True, (ORCHESTRATOR_NAME,))
        if role == "orchestrator-public":
            return cls(str(d / "orchestrator.pem"), str(d / "orchestrator-key.pem"), str(d / "ca.pem"))
        if role == "orchestrator-client":
            return cls(str(d / "orchestrator.pem"), str(d / "orchestrator-key.pem"), str(d / "ca.pem"),
                       server_name=WORKER_NAME)  # fmt: skip
        if role == "client":
            return cls(ca=str(d / "ca.pem"))
        raise ValueError(f"role must be worker, orchestrator-public, orchestrator-client or client, got {role!r}")

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise SecurityConfigError("a TLS server needs cert and key")
        cert = _read(self.cert, "cert")
        return grpc.ssl_server_credentials(
            [(_read(self.key, "key"), cert)],
            root_certificates=_read(self.ca, "ca") if self.ca else None,
            require_client_auth=self.require_client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "ca") if self.ca else None,
            private_key=_read(self.key, "key") if self.key else None,
            certificate_chain=_read(self.cert, "cert") if self.cert else None,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise SecurityConfigError(f"TLS {what} file {path!r} cannot be read: {error.strerror or error}") from error
    if b"-----BEGIN " not in data:
        raise SecurityConfigError(f"TLS {what} file {path!r} is not PEM (no -----BEGIN line)")
    return data


def api_key_from_env() -> str | None:
    """The API key in SPECSERVE_API_KEY (the only place it is read), or None."""
    return os.environ.get(API_KEY_ENV) or None


def read_api_key(path: str | None) -> str | None:
    """SPECSERVE_API_KEY when set, else the first line of `path` (a mounted secret), else None."""
    if key := api_key_from_env():
        return key
    if path is None:
        return None
    try:
        key = Path(path).read_text().strip()
    except OSError as error:
        raise SecurityConfigError(f"API key file {path!r} cannot be read: {error.strerror or error}") from error
    if not key:
        raise SecurityConfigError(f"API key file {path!r} is empty")
    return key


# ---------------------------------------------------------------------------------------------------
# Server side: who may call


def server_interceptors(tls: TLSConfig | None, api_key: str | None) -> list[grpc.aio.ServerInterceptor]:
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if api_key is not None:
        interceptors.append(BearerTokenInterceptor(api_key))
    if tls is not None and tls.allowed_peers:
        interceptors.append(PeerNameInterceptor(tls.allowed_peers))
    return interceptors


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Every call but health must carry `authorization: Bearer <key>`; others get UNAUTHENTICATED before
    their request is even parsed."""

    def __init__(self, api_key: str) -> None:
        if not api_key:
            raise SecurityConfigError("the API key must not be empty")
        self._expected = f"Bearer {api_key}".encode()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:  # fmt: skip
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHODS):
            return handler
        given = next((v for k, v in details.invocation_metadata or () if k == "authorization"), "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given_bytes, self._expected):
            return handler
        reason = "a bearer token is required" if not given else "the bearer token is not valid"
        return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, f"{reason} (metadata authorization: Bearer KEY)")


class PeerNameInterceptor(grpc.aio.ServerInterceptor):
    """Mutual TLS admits any certificate the CA signed; this admits only the named peers (the orchestrator)."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.allowed = frozenset(allowed)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:  # fmt: skip
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHODS):
            return handler
        return _checked(handler, self._check)

    def _check(self, context: grpc.aio.ServicerContext) -> str | None:
        """Why the caller is refused, or None."""
        names = peer_names(context.auth_context())
        if names & self.allowed:
            return None
        return f"this internal service answers only {sorted(self.allowed)}; the caller is {sorted(names) or 'unnamed'}"


def peer_names(auth_context: dict[str, list[bytes]]) -> set[str]:
    """CN and DNS SANs of the caller's verified certificate (empty without one)."""
    names = auth_context.get("x509_common_name", []) + auth_context.get("x509_subject_alternative_name", [])
    return {n.decode(errors="replace") for n in names}


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers `code` without reading the request."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        await context.abort(code, message)
        yield  # pragma: no cover - abort raises

    respond = stream if handler.response_streaming else unary
    return _same_kind(handler, respond, request_deserializer=None)


def _checked(
    handler: grpc.RpcMethodHandler, check: Callable[[grpc.aio.ServicerContext], str | None]
) -> grpc.RpcMethodHandler:
    behaviour = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream

    if handler.response_streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if (reason := check(context)) is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
            async for item in behaviour(request, context):
                yield item

        return _same_kind(handler, stream, handler.request_deserializer)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if (reason := check(context)) is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
        return await behaviour(request, context)

    return _same_kind(handler, unary, handler.request_deserializer)


def _same_kind(handler: grpc.RpcMethodHandler, behaviour: Any, request_deserializer: Any) -> grpc.RpcMethodHandler:
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(behaviour, request_deserializer=request_deserializer, response_serializer=handler.response_serializer)


# ---------------------------------------------------------------------------------------------------
# Client side


def bearer_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def client_channel(address: str, tls: TLSConfig | None = None, api_key: str | None = None,
                   options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:  # fmt: skip
    """A blocking channel to a specserve server, over TLS when `tls` is given, every call carrying the key."""
    options = [*options, *(tls.channel_options() if tls else [])]
    if tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, tls.channel_credentials(), options=options)
    if api_key:
        channel = grpc.intercept_channel(channel, _SyncBearer(api_key))
    return channel


def speaks_tls(address: str, timeout_s: float = 2.0) -> bool | None:
    """Whether the server at HOST:PORT answers a TLS handshake (None: no connection), so that a client's
    UNAVAILABLE can say "this server speaks TLS" instead of gRPC's "Socket closed". Verifies nothing."""
    import socket
    import ssl

    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout_s) as sock:
            try:
                with context.wrap_socket(sock, server_hostname=None):
                    return True
            except ssl.SSLError as error:  # an alert from the peer is still TLS (mutual TLS wanting a certificate)
                return "ALERT" in (error.reason or "").upper()
            except OSError:  # reset or closed: a plaintext server dropping the handshake
                return False
    except (OSError, ValueError):
        return None


def aio_channel(address: str, tls: TLSConfig | None = None, api_key: str | None = None,
                options: Sequence[tuple[str, Any]] = (),
                interceptors: Sequence[grpc.aio.ClientInterceptor] = ()) -> grpc.aio.Channel:  # fmt: skip
    """The asyncio form of client_channel (`interceptors` run after the key is added)."""
    options = [*options, *(tls.channel_options() if tls else [])]
    bearer = [_AioUnaryBearer(api_key), _AioStreamBearer(api_key)] if api_key else []
    interceptors = [*bearer, *interceptors] or None
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options, interceptors=interceptors)


def _with_key(details: Any, api_key: str) -> Any:
    metadata = [*(details.metadata or ()), *bearer_metadata(api_key)]
    return details._replace(metadata=metadata)


class _SyncBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, api_key: str) -> None:
        self.api_key = api_key

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_key(details, self.api_key), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_key(details, self.api_key), request)


class _AioUnaryBearer(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, api_key: str) -> None:
        self.api_key = api_key

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_key(details, self.api_key), request)


class _AioStreamBearer(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, api_key: str) -> None:
        self.api_key = api_key

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_key(details, self.api_key), request)
