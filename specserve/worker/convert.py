"""Conversions between the internal worker messages of specserve.v1 and the core's types, for both ends of
the wire: the workers' servicers and the orchestrator's remote clients (orchestrator/remote.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from protos import specserve_pb2 as pb
from specserve.core.types import Proposal, SamplingParams, SparseProbs, Verdict
from specserve.placement import Placement
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS

if TYPE_CHECKING:  # annotations only: the orchestrator decodes with this module and loads no model
    from specserve.models.loading import LoadedModel


def sampling_to_proto(sampling: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)


def sampling_from_proto(message: pb.SamplingParams, seed: int | None = None) -> SamplingParams:
    return SamplingParams(message.temperature, message.top_p or 1.0, message.top_k, seed)  # validates


def probs_to_proto(probs: SparseProbs | None) -> pb.SparseProbs | None:
    if probs is None:
        return None
    return pb.SparseProbs(
        row_lengths=[len(token_ids) for token_ids in probs.token_ids],
        token_ids=[token_id for token_ids in probs.token_ids for token_id in token_ids.tolist()],
        probs=[value for values in probs.probs for value in values.tolist()],
    )


def probs_from_proto(message: pb.SparseProbs, vocab_size: int) -> SparseProbs:
    """Raises ValueError on a malformed message."""
    lengths = list(message.row_lengths)
    if sum(lengths) != len(message.token_ids) or len(message.token_ids) != len(message.probs):
        raise ValueError("draft_probs: row_lengths, token_ids and probs do not line up")
    if any(length < 0 for length in lengths):  # a negative length could still sum up right
        raise ValueError("draft_probs: row_lengths must be >= 0")
    # checked in Python, not by torch reductions: this runs on a worker's event loop thread, and a torch
    # op large enough to go parallel there would start a second OpenMP team (see specserve.worker.serve)
    ids, values = list(message.token_ids), list(message.probs)
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        raise ValueError(f"draft_probs: token ids must be in [0, {vocab_size})")
    if values and (min(values) < 0 or not math.isfinite(sum(values))):  # a NaN or inf makes the sum one
        raise ValueError("draft_probs: probabilities must be finite and >= 0")
    token_ids, probs = torch.tensor(ids, dtype=torch.long), torch.tensor(values, dtype=torch.float32)
    return SparseProbs(token_ids.split(lengths), probs.split(lengths))


def proposal_to_proto(proposal: Proposal) -> pb.ProposeResponse:
    return pb.ProposeResponse(
        token_ids=proposal.token_ids, probs=probs_to_proto(proposal.probs), source=proposal.source
    )


def proposal_from_proto(
    token_ids: list[int], probs: pb.SparseProbs | None, vocab_size: int, source: str = ""
) -> Proposal:
    # checked first: the target densifies the rows, and a few MB of row_lengths would be [rows, vocab] floats
    if len(token_ids) > MAX_NUM_SPECULATIVE_TOKENS:
        raise ValueError(f"at most {MAX_NUM_SPECULATIVE_TOKENS} draft tokens per round, got {len(token_ids)}")
    num_rows = len(probs.row_lengths) if probs is not None else 0
    if num_rows and num_rows != len(token_ids):
        raise ValueError(f"draft_probs has {num_rows} rows for {len(token_ids)} draft tokens")
    sparse = probs_from_proto(probs, vocab_size) if probs is not None and num_rows else None
    return Proposal(list(token_ids), sparse, source)


def verdict_from_proto(message: pb.VerifyResponse) -> Verdict:
    return Verdict(list(message.token_ids), message.num_accepted)


def model_info_to_proto(loaded: LoadedModel, fingerprint: str, placement: Placement) -> pb.ModelInfoResponse:
    return pb.ModelInfoResponse(
        model=loaded.name,
        tokenizer_fingerprint=fingerprint,
        vocab_size=loaded.vocab_size,
        padded_vocab_size=loaded.padded_vocab_size,
        max_context=loaded.max_context,
        eos_token_ids=sorted(loaded.eos_token_ids),
        placement=pb.Placement(host=placement.host, device=placement.device, cpus=sorted(placement.cpus)),
    )


def lookup_info_to_proto(name: str, placement: Placement) -> pb.ModelInfoResponse:
    """A drafter without a model or tokenizer (prompt lookup): it serves any target."""
    return pb.ModelInfoResponse(
        model=name,
        token_agnostic=True,
        placement=pb.Placement(host=placement.host, device=placement.device, cpus=sorted(placement.cpus)),
    )


def placement_from_proto(message: pb.ModelInfoResponse) -> Placement | None:
    """None from a worker that does not say (an older version)."""
    if not message.HasField("placement"):
        return None
    p = message.placement
    return Placement(p.host, p.device, frozenset(p.cpus))

