"""TargetService over gRPC: decode the request, call the worker on its model thread, encode."""

from __future__ import annotations

import grpc

from protos import convert
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.models.tokenizers import TokenizerSpec
from specserve.rpc import WorkerServicer, unary_errors
from target_service.worker import TargetWorker


class TargetServicer(WorkerServicer, pb_grpc.TargetServiceServicer):
    executor_name = "target-model"
    worker: TargetWorker

    def attach(self, worker: TargetWorker) -> None:
        super().attach(worker)
        self.fingerprint = TokenizerSpec.of(worker.loaded.tokenizer, worker.loaded.vocab_size).fingerprint()

    @unary_errors
    async def GetModelInfo(
        self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfoResponse:
        return convert.model_info_to_proto(self.worker.loaded, self.fingerprint)

    @unary_errors
    async def Prefill(self, request: pb.PrefillRequest, context: grpc.aio.ServicerContext) -> pb.PrefillResponse:
        seed = request.seed if request.HasField("seed") else None
        await self.executor.run(self.worker.prefill, request.session_id, list(request.prompt_token_ids), seed)
        return pb.PrefillResponse()

    @unary_errors
    async def Verify(self, request: pb.VerifyRequest, context: grpc.aio.ServicerContext) -> pb.VerifyResponse:
        sampling = convert.sampling_from_proto(request.sampling)
        draft_probs = request.draft_probs if request.HasField("draft_probs") else None
        proposal = convert.proposal_from_proto(
            list(request.draft_token_ids), draft_probs, self.worker.loaded.vocab_size
        )
        verdict, seconds = await self.executor.timed(self.worker.verify, request.session_id, proposal, sampling)
        response = convert.verdict_to_proto(verdict)
        response.compute_ms = seconds * 1000
        return response

    @unary_errors
    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        self.worker.release(request.session_id)
        return pb.ReleaseResponse()
