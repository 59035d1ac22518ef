"""The public API's messages <-> specserve's types: GenerateRequest <-> GenerationRequest, and the
statistics of a response."""

from __future__ import annotations

from protos import specserve_pb2 as pb
from specserve.config import GenerationRequest
from specserve.core.stats import SpeculationStats
from specserve.core.types import SamplingParams

DEFAULT_MAX_TOKENS = 128


def generation_request_from_proto(message: pb.GenerateRequest) -> GenerationRequest:
    """Validates as it converts: a ValueError names the bad field."""
    if bool(message.prompt) == bool(message.messages):
        raise ValueError("give exactly one of prompt and messages")
    if message.max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 1 (0 = the default {DEFAULT_MAX_TOKENS}), got {message.max_tokens}")
    sampling = SamplingParams(
        temperature=message.temperature,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        top_k=message.top_k,
        seed=message.seed if message.HasField("seed") else None,
    )
    return GenerationRequest(
        prompt=message.prompt or None,
        messages=tuple((m.role, m.content) for m in message.messages) or None,
        max_tokens=message.max_tokens or DEFAULT_MAX_TOKENS,
        sampling=sampling,
        stop=tuple(message.stop),
        num_speculative_tokens=message.num_speculative_tokens if message.HasField("num_speculative_tokens") else None,
        ignore_eos=message.ignore_eos,
    )


def generation_request_to_proto(request: GenerationRequest) -> pb.GenerateRequest:
    sampling = request.sampling
    return pb.GenerateRequest(
        prompt=request.prompt or "",
        messages=[pb.ChatMessage(role=r, content=c) for r, c in request.messages or ()],
        max_tokens=request.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        stop=list(request.stop),
        num_speculative_tokens=request.num_speculative_tokens,
        ignore_eos=request.ignore_eos,
    )


def stats_to_proto(stats: SpeculationStats) -> pb.GenerationStats:
    return pb.GenerationStats(**stats.summary())
