"""The OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models) and /metrics,
served by aiohttp on the orchestrator's event loop. Generation goes through Orchestrator.generate, the
same path as the gRPC API; streams are server-sent events in OpenAI's format."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from orchestrator.openai_api import ApiError, ParsedRequest, Shape, error_for, model_card, parse
from orchestrator.pipeline import Chunk
from orchestrator.service import Orchestrator
from specserve.config import GenerationRequest
from specserve.logs import bind_request_id
from specserve.prompts import tokenize_request
from specserve.rpc import MAX_MESSAGE_BYTES, OverloadedError
from specserve.security import TLSConfig

logger = logging.getLogger(__name__)
REQUEST_ID = web.RequestKey("request_id", str)

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpApi:
    def __init__(self, orchestrator: Orchestrator, api_key: str | None = None, tls: TLSConfig | None = None) -> None:
        self.orchestrator, self.tls = orchestrator, tls
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self.app = web.Application(middlewares=[self._middleware], client_max_size=MAX_MESSAGE_BYTES)
        self.app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model}", self.model),
            web.get("/metrics", self.metrics),
            web.get("/health", self.health),
        ])  # fmt: skip
        self._runner: web.AppRunner | None = None

    @property
    def model_id(self) -> str:
        return self.orchestrator.target_info.model

    async def start(self, host: str, port: int, grace_s: float = 30.0) -> str:
        """Listen on host:port (0: a free port); returns the base URL. On stop(), requests in flight get
        `grace_s` to finish."""
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=grace_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl_context())
        await site.start()
        bound = self._runner.addresses[0][1]
        return f"{'https' if self.tls else 'http'}://{host}:{bound}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The public gRPC API's certificate serves HTTPS too."""
        if self.tls is None or self.tls.cert is None or self.tls.key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls.cert, self.tls.key)
        if self.tls.require_client_auth and self.tls.ca:
            context.load_verify_locations(self.tls.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Request id, authentication, and every error in OpenAI's shape."""
        request_id = bind_request_id(request.headers.get("X-Request-Id"))
        request[REQUEST_ID] = request_id
        try:
            self._authenticate(request)
            response = await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            response = self._refuse(request, ApiError(error.status, f"{request.method} {request.path}: {error.reason}"))
        except ApiError as error:
            response = self._refuse(request, error)
        except Exception as error:  # noqa: BLE001 - generation failed: Orchestrator.generate counted it
            api_error = error_for(error, ("max_tokens", "num_speculative_tokens", "prompt", "messages"))
            if api_error.status == 500:
                logger.exception("%s %s failed", request.method, request.path)
            response = _error_response(api_error)
            if isinstance(error, OverloadedError) and error.retry_after_s is not None:
                response.headers["Retry-After"] = str(math.ceil(error.retry_after_s))
                response.headers["Retry-After-Ms"] = str(math.ceil(1000 * error.retry_after_s))
        if not response.prepared:
            response.headers["X-Request-Id"] = request_id
        return response

    def _authenticate(self, request: web.Request) -> None:
        if self._expected is None or not request.path.startswith("/v1/"):
            return  # /metrics and /health stay open for scrapers and probes (keep the port private)
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, self._expected):
            reason = "the API key is not valid" if given else "an API key is required"
            raise ApiError(401, f"{reason} (header Authorization: Bearer KEY)", code="invalid_api_key")

    def _refuse(self, request: web.Request, error: ApiError) -> web.Response:
        if request.method == "POST" and request.path in GENERATION_PATHS:
            self.orchestrator.metrics.observe_refused("http", error.status_name)
        return _error_response(error)

    # -----------------------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        self._check_model(request.match_info["model"])
        return web.json_response(self._card())

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.orchestrator.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _card(self) -> dict[str, Any]:
        o = self.orchestrator
        draft = o.draft_info.model if o.draft_info else None
        return model_card(self.model_id, draft, o.target_info.max_context, o.adaptive, o.default_k, o.max_adaptive_k)

    def _check_model(self, model: Any) -> None:
        if model is not None and model != self.model_id:
            raise ApiError(404, f"the model {model!r} is not served here; this server serves {self.model_id!r}",
                           "model", "model_not_found")  # fmt: skip

    def _room(self, request: GenerationRequest) -> int:
        info = self.orchestrator.target_info
        return info.max_context - len(tokenize_request(self.orchestrator.tokenizer, request, info.max_context,
                                                       info.vocab_size))  # fmt: skip

    async def _generate(self, http_request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await http_request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the request body is not valid JSON: {error}") from error
        if isinstance(body, dict):
            self._check_model(body.get("model"))
        parsed = parse(body, chat, self._room)
        shape = Shape.of(http_request[REQUEST_ID], self.model_id, chat)
        chunks = self.orchestrator.generate(parsed.request, "http")
        async with contextlib.aclosing(chunks):
            if not parsed.stream:
                text = []
                async for chunk in chunks:
                    text.append(chunk.text)
                result = chunk.decoder.result
                return web.json_response(shape.response("".join(text), result.finish_reason, result.stats))
            first = await anext(chunks)  # errors before the first token still get their own HTTP status
            return await self._stream(http_request, parsed, shape, first, chunks)

    async def _stream(
        self, http_request: web.Request, parsed: ParsedRequest, shape: Shape, first: Chunk, rest: AsyncIterator[Chunk]
    ) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        response = web.StreamResponse(headers=headers | {"X-Request-Id": http_request[REQUEST_ID]})
        await response.prepare(http_request)
        if parsed.chat:
            await _send(response, shape.chunk(None))
        chunk = first
        try:
            while True:
                if chunk.text:
                    await _send(response, shape.chunk(chunk.text))
                try:
                    chunk = await anext(rest)
                except StopAsyncIteration:
                    break
        except ConnectionError:
            raise  # the client went away: nobody to tell
        except Exception as error:  # noqa: BLE001 - the status line went out: the error goes in the stream
            api_error = error_for(error)
            if api_error.status == 500:
                logger.exception("stream failed")
            await _send(response, api_error.body())
            return response
        result = chunk.decoder.result
        await _send(response, shape.chunk("", result.finish_reason, result.stats))
        if parsed.include_usage:
            await _send(response, shape.usage_chunk(result.stats))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _send(response: web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")


def _error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)
