"""Conversions between specserve.v1 messages and the core's types: the one place that knows both."""

from __future__ import annotations

import torch

from protos import specserve_pb2 as pb
from specserve.config import GenerationRequest
from specserve.core.stats import SpeculationStats
from specserve.core.types import Proposal, SamplingParams, Verdict
from specserve.core.verify import sparse_rows
from specserve.models.loading import LoadedModel
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS


def sampling_to_proto(sampling: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)


def sampling_from_proto(message: pb.SamplingParams, seed: int | None = None) -> SamplingParams:
    return SamplingParams(message.temperature, message.top_p or 1.0, message.top_k, seed)  # validates


def probs_to_proto(probs: torch.Tensor | None) -> pb.SparseProbs | None:
    """probs: [k, vocab] -> only each row's support."""
    if probs is None:
        return None
    message = pb.SparseProbs()
    for token_ids, values in sparse_rows(probs):
        message.row_lengths.append(len(token_ids))
        message.token_ids.extend(token_ids)
        message.probs.extend(values)
    return message


def probs_from_proto(message: pb.SparseProbs, vocab_size: int) -> torch.Tensor:
    """-> [k, vocab] float32. Raises ValueError on a malformed message."""
    lengths = list(message.row_lengths)
    if sum(lengths) != len(message.token_ids) or len(message.token_ids) != len(message.probs):
        raise ValueError("draft_probs: row_lengths, token_ids and probs do not line up")
    dense = torch.zeros(len(lengths), vocab_size, dtype=torch.float32)
    if not lengths:
        return dense
    rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.long))
    columns = torch.tensor(list(message.token_ids), dtype=torch.long)
    if columns.numel() and (columns.min() < 0 or columns.max() >= vocab_size):
        raise ValueError(f"draft_probs: token ids must be in [0, {vocab_size})")
    values = torch.tensor(list(message.probs), dtype=torch.float32)
    if not torch.isfinite(values).all() or (values < 0).any():
        raise ValueError("draft_probs: probabilities must be finite and >= 0")
    dense[rows, columns] = values
    return dense


def proposal_to_proto(proposal: Proposal) -> pb.ProposeResponse:
    return pb.ProposeResponse(token_ids=proposal.token_ids, probs=probs_to_proto(proposal.probs))


def proposal_from_proto(token_ids: list[int], probs: pb.SparseProbs | None, vocab_size: int) -> Proposal:
    # checked before densifying: a few MB of row_lengths would otherwise allocate [rows, vocab] floats
    if len(token_ids) > MAX_NUM_SPECULATIVE_TOKENS:
        raise ValueError(f"at most {MAX_NUM_SPECULATIVE_TOKENS} draft tokens per round, got {len(token_ids)}")
    num_rows = len(probs.row_lengths) if probs is not None else 0
    if num_rows and num_rows != len(token_ids):
        raise ValueError(f"draft_probs has {num_rows} rows for {len(token_ids)} draft tokens")
    dense = probs_from_proto(probs, vocab_size) if probs is not None and num_rows else None
    return Proposal(list(token_ids), dense)


def verdict_to_proto(verdict: Verdict) -> pb.VerifyResponse:
    return pb.VerifyResponse(token_ids=verdict.token_ids, num_accepted=verdict.num_accepted)


def verdict_from_proto(message: pb.VerifyResponse) -> Verdict:
    return Verdict(list(message.token_ids), message.num_accepted)


def model_info_to_proto(loaded: LoadedModel, fingerprint: str) -> pb.ModelInfoResponse:
    return pb.ModelInfoResponse(
        model=loaded.name,
        tokenizer_fingerprint=fingerprint,
        vocab_size=loaded.vocab_size,
        max_context=loaded.max_context,
        eos_token_ids=sorted(loaded.eos_token_ids),
    )


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
