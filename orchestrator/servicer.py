"""The public Orchestrator service (Generate, GenerateStream, GetServerInfo) and the Admin service
(ListReplicas, Scale)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from orchestrator import generation
from orchestrator.metrics import GIVEN_UP
from orchestrator.service import Orchestrator
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve import __version__
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS
from specserve.rpc import stream_errors, unary_errors


class OrchestratorServicer(pb_grpc.OrchestratorServicer):
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    @unary_errors
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        async for chunk in self.orchestrator.generate(generation.generation_request_from_proto(request), "grpc"):  # noqa: B007
            pass  # the last chunk's decoder holds the whole result
        result = chunk.decoder.result
        return pb.GenerateResponse(
            text=result.text,
            token_ids=result.token_ids,
            finish_reason=result.finish_reason or "",
            stats=generation.stats_to_proto(result.stats),
        )

    @stream_errors
    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in self.orchestrator.generate(generation.generation_request_from_proto(request), "grpc"):
            result = chunk.decoder.result
            final = result.finish_reason is not None and not chunk.token_ids
            yield pb.GenerateChunk(
                text=chunk.text,
                token_ids=chunk.token_ids,
                finish_reason=result.finish_reason if final else "",
                stats=generation.stats_to_proto(result.stats) if final else None,
            )

    @unary_errors
    async def GetServerInfo(
        self, request: pb.ServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerInfoResponse:
        o = self.orchestrator
        return pb.ServerInfoResponse(
            version=__version__,
            target_model=o.target_info.model,
            draft_model=o.draft_info.model if o.draft_info else "",
            tokenizer_fingerprint=o.target_info.tokenizer_fingerprint,
            default_num_speculative_tokens=o.default_k,
            max_num_speculative_tokens=MAX_NUM_SPECULATIVE_TOKENS,
            max_context=o.target_info.max_context,
            adaptive=o.adaptive,
            max_adaptive_num_speculative_tokens=o.max_adaptive_k,
        )


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    @unary_errors
    async def ListReplicas(
        self, request: pb.ListReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListReplicasResponse:
        return pb.ListReplicasResponse(replica_set=self._replica_set())

    @unary_errors
    async def Scale(self, request: pb.ScaleRequest, context: grpc.aio.ServicerContext) -> pb.ScaleResponse:
        wanted = {
            role: getattr(request, f"{role}_replicas")
            for role in ("target", "draft")
            if request.HasField(f"{role}_replicas")
        }
        if not wanted:
            raise ValueError("give draft_replicas, target_replicas or both")
        for role, num_replicas in wanted.items():
            await self.orchestrator.scale(role, num_replicas)
        return pb.ScaleResponse(replica_set=self._replica_set())

    def _replica_set(self) -> pb.ReplicaSet:
        o = self.orchestrator
        replicas = [
            pb.ReplicaInfo(role=role, address=r.address, state=r.state, active_sessions=r.num_sessions)
            for role in ("target", "draft")
            for r in o.replicas(role)
        ]
        replicas += [
            pb.ReplicaInfo(role=role, address=g.name, state=GIVEN_UP, detail=g.reason)
            for role in ("target", "draft")
            for g in o.fleet.given_up(role)
        ]
        return pb.ReplicaSet(
            replicas=replicas,
            desired_draft_replicas=o.fleet.desired("draft"),
            desired_target_replicas=o.fleet.desired("target"),
        )
