"""Async clients of the internal DraftService and TargetService. Every call has a deadline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from orchestrator.round_stream import RoundMux
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.core.types import Proposal, SamplingParams, Verdict
from specserve.logs import RpcObserver
from specserve.placement import Placement
from specserve.rpc import server_options
from specserve.security import TLSConfig, aio_channel
from specserve.worker import convert


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Seconds allowed per internal call."""

    prefill_s: float = 120.0  # long prompts on slow hardware
    round_s: float = 30.0  # one propose or verify
    control_s: float = 5.0  # info, release


@dataclass(frozen=True, slots=True)
class PassReport:
    """What a worker says about the pass that served a call."""

    compute_s: float
    batch_size: int
    pass_s: float = 0.0
    """Of compute_s, the time in the model's forward passes."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model: str
    tokenizer_fingerprint: str
    vocab_size: int
    max_context: int
    eos_token_ids: frozenset[int]
    placement: Placement | None = None
    token_agnostic: bool = False
    """A drafter that needs no tokenizer (prompt lookup): any target may use it."""
    padded_vocab_size: int = 0
    """The model's logits width: vocab_size plus padding rows, masked out (0 for a token-agnostic drafter)."""


class _WorkerClient:
    """The calls both services answer; `stub` is the service's own."""

    stub: pb_grpc.DraftServiceStub | pb_grpc.TargetServiceStub
    rounds: RoundMux
    """The sessions' round calls (Propose or Verify), all on one stream."""

    def __init__(
        self, address: str, deadlines: Deadlines, tls: TLSConfig | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (), observe: RpcObserver | None = None,
    ) -> None:  # fmt: skip
        """tls: call the worker over TLS (its certificate checked against tls.ca, ours presented); observe:
        told of every round call on a stream (unary calls: by the interceptors)."""
        self.address = address
        self.deadlines = deadlines
        self.observe = observe
        self.channel = aio_channel(address, tls, options=server_options(), interceptors=interceptors)

    async def _call(self, method: str, request: Message, timeout_s: float) -> Any:
        """One call of the stub; a channel the replica pool already closed (it removed the replica while a
        session still held it) fails like a dead worker, UNAVAILABLE, so callers fail over or move on."""
        try:
            return await getattr(self.stub, method)(request, timeout=timeout_s)
        except grpc.aio.UsageError as error:
            no_metadata = grpc.aio.Metadata()
            details = f"{self.address}: {error}"
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, no_metadata, no_metadata, details) from error

    async def model_info(self) -> ModelInfo:
        return _model_info(await self._call("GetModelInfo", pb.ModelInfoRequest(), self.deadlines.control_s))

    async def prefill(
        self, session_id: str, prompt_token_ids: list[int], seed: int | None, first_token: SamplingParams | None = None
    ) -> int | None:
        """With `first_token` (a target only), the first output token, chosen in the prefill's last pass."""
        request = pb.PrefillRequest(session_id=session_id, prompt_token_ids=prompt_token_ids, seed=seed)
        if first_token is not None:
            request.first_token.CopyFrom(convert.sampling_to_proto(first_token))
        response = await self._call("Prefill", request, self.deadlines.prefill_s)
        return response.first_token_id if response.HasField("first_token_id") else None

    async def release(self, session_id: str) -> None:
        """The session's KV cache is freed; its round calls share the worker's stream, which stays open."""
        await self._call("Release", pb.ReleaseRequest(session_id=session_id), self.deadlines.control_s)

    async def close(self, grace_s: float | None = None) -> None:
        self.rounds.close_all()
        await self.channel.close(grace_s)


class DraftClient(_WorkerClient):
    def __init__(
        self, address: str, deadlines: Deadlines = Deadlines(), tls: TLSConfig | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (), observe: RpcObserver | None = None,
    ) -> None:  # fmt: skip
        super().__init__(address, deadlines, tls, interceptors, observe)
        self.stub = pb_grpc.DraftServiceStub(self.channel)
        propose = "/specserve.v1.DraftService/Propose"
        self.rounds = RoundMux(address, self.stub.ProposeRounds, pb.ProposeBatch, propose, observe)

    async def propose(
        self,
        session_id: str,
        num_kept: int,
        new_token_ids: list[int],
        k: int,
        sampling: SamplingParams,
        vocab_size: int,
        timeout_s: float | None = None,
        confidence_threshold: float = 0.0,
        target_idle: bool = False,
    ) -> tuple[Proposal, PassReport]:
        """`timeout_s` (default: the round deadline) lets the caller give up sooner on a slow draft."""
        request = pb.ProposeRequest(
            session_id=session_id,
            num_kept=num_kept,
            new_token_ids=new_token_ids,
            k=k,
            sampling=convert.sampling_to_proto(sampling),
            confidence_threshold=confidence_threshold,
            target_idle=target_idle,
        )
        response = await self.rounds.call(session_id, request, timeout_s or self.deadlines.round_s)
        probs = response.probs if response.HasField("probs") else None
        report = PassReport(response.compute_ms / 1000, response.batch_size, response.pass_ms / 1000)
        return convert.proposal_from_proto(list(response.token_ids), probs, vocab_size, response.source), report


class TargetClient(_WorkerClient):
    def __init__(
        self, address: str, deadlines: Deadlines = Deadlines(), tls: TLSConfig | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (), observe: RpcObserver | None = None,
    ) -> None:  # fmt: skip
        super().__init__(address, deadlines, tls, interceptors, observe)
        self.stub = pb_grpc.TargetServiceStub(self.channel)
        verify = "/specserve.v1.TargetService/Verify"
        self.rounds = RoundMux(address, self.stub.VerifyRounds, pb.VerifyBatch, verify, observe)

    async def verify(self, session_id: str, proposal: Proposal, sampling: SamplingParams) -> tuple[Verdict, PassReport]:
        request = pb.VerifyRequest(
            session_id=session_id,
            draft_token_ids=proposal.token_ids,
            draft_probs=convert.probs_to_proto(proposal.probs),
            sampling=convert.sampling_to_proto(sampling),
        )
        response = await self.rounds.call(session_id, request, self.deadlines.round_s)
        report = PassReport(response.compute_ms / 1000, response.batch_size, response.pass_ms / 1000)
        return convert.verdict_from_proto(response), report

    async def decode_run(
        self,
        session_id: str,
        num_tokens: int,
        stop_token_ids: frozenset[int],
        sampling: SamplingParams,
        on_tokens: Callable[[list[int]], None],
    ) -> PassReport:
        """Target-only decoding of up to `num_tokens` tokens in one call (a run), ending after a stop token;
        `on_tokens` hears them as they are decoded, each once. The deadline is a round's, per token."""
        request = pb.VerifyRequest(
            session_id=session_id,
            sampling=convert.sampling_to_proto(sampling),
            num_tokens=num_tokens,
            stop_token_ids=sorted(stop_token_ids),
        )
        num_heard = 0

        def hear(response: pb.VerifyResponse) -> None:
            nonlocal num_heard
            num_heard += len(response.token_ids)
            on_tokens(list(response.token_ids))

        response = await self.rounds.call(session_id, request, self.deadlines.round_s, on_partial=hear)
        if len(response.token_ids) > num_heard:  # the last token, or all of them when no partial came
            on_tokens(list(response.token_ids[num_heard:]))
        return PassReport(response.compute_ms / 1000, response.batch_size, response.pass_ms / 1000)


def _model_info(message: pb.ModelInfoResponse) -> ModelInfo:
    return ModelInfo(
        message.model,
        message.tokenizer_fingerprint,
        message.vocab_size,
        message.max_context,
        frozenset(message.eos_token_ids),
        convert.placement_from_proto(message),
        message.token_agnostic,
        message.padded_vocab_size,
    )
