"""OpenAI's shapes: request bodies of /v1/completions and /v1/chat/completions read into a
GenerationRequest, and responses, stream chunks and errors written as OpenAI's clients expect them.
No I/O: orchestrator/http_api.py serves these."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from specserve.config import GenerationRequest
from specserve.core.stats import SpeculationStats
from specserve.core.types import SamplingParams
from specserve.rpc import status_for

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
    503: "service_unavailable_error", 504: "timeout_error",
}  # fmt: skip
STATUS_NAMES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                405: "invalid_argument", 413: "invalid_argument"}  # fmt: skip
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Accepted only at their defaults: refusing beats silently ignoring what the caller asked for.
UNSUPPORTED = {
    "echo": (False,), "suffix": (None,), "logprobs": (None, False, 0), "top_logprobs": (None, 0), "best_of": (None, 1),
    "logit_bias": (None,), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "tools": (None,), "functions": (None,), "tool_choice": (None, "none"), "parallel_tool_calls": (None,),
}  # fmt: skip


class ApiError(Exception):
    """An error as OpenAI's API reports it: HTTP status and {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def status_name(self) -> str:
        """The metrics label: the gRPC status name a gRPC caller would have got."""
        return STATUS_NAMES.get(self.status, "internal")

    def body(self) -> dict[str, Any]:
        kind = ERROR_TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def error_for(error: BaseException, params: tuple[str, ...] = ()) -> ApiError:
    """The one exception -> status mapping (specserve.rpc.status_for), in HTTP terms."""
    if isinstance(error, ApiError):
        return error
    code = status_for(error)
    status = HTTP_STATUS.get(code, 500)
    if isinstance(error, grpc.aio.AioRpcError):
        message = f"an internal service failed: {error.code().name}: {error.details()}"
    elif status == 500:
        message = "internal error (logged with its traceback on the server)"
    else:
        message = str(error) or type(error).__name__
    param = next((p for p in params if message.startswith(p + " ")), None)  # "temperature must be >= 0, ..."
    return ApiError(status, message, param, code.name.lower() if status != 500 else None)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    request: GenerationRequest
    chat: bool
    stream: bool
    include_usage: bool


PARAMS = ("prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
          "num_speculative_tokens", "model")  # fmt: skip


def parse(body: Any, chat: bool, room: Callable[[GenerationRequest], int]) -> ParsedRequest:
    """`body` of a completions (chat: chat completions) request. `room(request)`: tokens left in the
    context after its prompt, the default max_tokens of a chat request."""
    if not isinstance(body, Mapping):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    for name, allowed in UNSUPPORTED.items():
        if body.get(name, allowed[0]) not in allowed and not (name == "logit_bias" and body[name] == {}):
            raise ApiError(400, f"{name} is not supported by this server; leave it out", name, "unsupported_parameter")
    if _get(body, "n", int, 1) != 1:
        raise ApiError(400, "n must be 1: this server returns one choice per request", "n")
    if chat:
        prompt, messages = None, _messages(body)
    else:
        prompt, messages = _prompt(body), None
    token_ids = prompt if isinstance(prompt, tuple) else None
    text = prompt if isinstance(prompt, str) else None
    max_tokens = _get(body, "max_tokens", int, None)
    if chat and max_tokens is None:
        max_tokens = _get(body, "max_completion_tokens", int, None)
    stream_options = _get(body, "stream_options", dict, None) or {}
    try:
        sampling = SamplingParams(
            _get(body, "temperature", float, 1.0), _get(body, "top_p", float, 1.0), _get(body, "top_k", int, 0),
            _get(body, "seed", int, None),
        )  # fmt: skip
        stop = _get(body, "stop", (str, list), None)
        request = GenerationRequest(
            prompt=text,
            messages=messages,
            prompt_token_ids=token_ids,
            max_tokens=DEFAULT_COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens,
            sampling=sampling,
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            num_speculative_tokens=_get(body, "num_speculative_tokens", int, None),
            ignore_eos=_get(body, "ignore_eos", bool, False),
        )
        if chat and max_tokens is None:  # OpenAI's chat default: as many as the context has room for
            request = _replace_max_tokens(request, room(request))
    except (ValueError, TypeError) as error:
        raise error_for(ValueError(str(error)), PARAMS) from error
    return ParsedRequest(request, chat, _get(body, "stream", bool, False), bool(stream_options.get("include_usage")))


def _replace_max_tokens(request: GenerationRequest, max_tokens: int) -> GenerationRequest:
    return dataclasses.replace(request, max_tokens=max(1, max_tokens))


def _get(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join({"str": "a string", "list": "a list", "dict": "an object", "bool": "true or false",
                             "int": "an integer", "float": "a number"}[k.__name__] for k in kinds)  # fmt: skip
        raise ApiError(400, f"{name} must be {names}, got {value!r}", name)
    if name == "stop" and isinstance(value, list) and not all(isinstance(s, str) for s in value):
        raise ApiError(400, f"stop must be a string or a list of strings, got {value!r}", name)
    return value


def _prompt(body: Mapping[str, Any]) -> str | tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(prompt)
    raise ApiError(
        400, "prompt must be a non-empty string or list of token ids (one prompt per request), "
        f"got {str(prompt)[:80]!r}", "prompt",
    )  # fmt: skip


def _messages(body: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in CHAT_ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}, got {role!r}", "messages")
        out.append((CHAT_ROLES[role], _content(message.get("content"), i)))
    return tuple(out)


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")


# ---------------------------------------------------------------------------------------------------
# Responses


def usage(stats: SpeculationStats) -> dict[str, int]:
    prompt, completion = stats.num_prompt_tokens, stats.num_generated
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def speculation(stats: SpeculationStats) -> dict[str, float]:
    """The extra field: specserve's per-request speculation figures (GenerationStats in the proto)."""
    return stats.summary() | {"per_token_acceptance": stats.per_token_acceptance}


@dataclass(frozen=True, slots=True)
class Shape:
    """The envelope of one request's response or stream chunks."""

    id: str
    model: str
    chat: bool
    created: int = 0

    @classmethod
    def of(cls, request_id: str, model: str, chat: bool) -> Shape:
        return cls(("chatcmpl-" if chat else "cmpl-") + request_id, model, chat, int(time.time()))

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion.chunk" if chunk else "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, text: str, finish_reason: str | None, stats: SpeculationStats) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish(finish_reason)}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return self._envelope(False) | {"choices": [choice], "usage": usage(stats), "speculation": speculation(stats)}

    def chunk(
        self, text: str | None, finish_reason: str | None = None, stats: SpeculationStats | None = None
    ) -> dict[str, Any]:
        """text None on a chat stream's first chunk: it carries the role."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish(finish_reason)}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text} if text else {}
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        out = self._envelope(self.chat) | {"choices": [choice]}
        if stats is not None:
            out["speculation"] = speculation(stats)
        return out

    def usage_chunk(self, stats: SpeculationStats) -> dict[str, Any]:
        return self._envelope(self.chat) | {"choices": [], "usage": usage(stats)}


def _finish(reason: str | None) -> str | None:
    return None if reason is None else FINISH_REASONS.get(reason, reason)


def model_card(
    model: str,
    draft_model: str | None,
    max_context: int,
    adaptive: bool,
    num_speculative_tokens: int,
    max_adaptive_k: int,
) -> dict[str, Any]:
    """`speculation`: what a request that does not set k gets: adaptive k in 0..max_speculative_tokens, or
    the fixed num_speculative_tokens (which seeded samples keep either way)."""
    speculation = {"adaptive": adaptive, "num_speculative_tokens": num_speculative_tokens,
                   "max_speculative_tokens": max_adaptive_k}  # fmt: skip
    return {
        "id": model, "object": "model", "created": 0, "owned_by": "specserve",
        "max_model_len": max_context, "draft_model": draft_model, "speculation": speculation,
    }  # fmt: skip
