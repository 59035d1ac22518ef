"""DraftService over gRPC: decode the request, call the worker on its model thread, encode."""

from __future__ import annotations

import grpc

from draft_service.worker import DraftWorker
from protos import convert
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.models.tokenizers import TokenizerSpec
from specserve.rpc import WorkerServicer, unary_errors


class DraftServicer(WorkerServicer, pb_grpc.DraftServiceServicer):
    executor_name = "draft-model"
    worker: DraftWorker

    def attach(self, worker: DraftWorker) -> None:
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
    async def Propose(self, request: pb.ProposeRequest, context: grpc.aio.ServicerContext) -> pb.ProposeResponse:
        sampling = convert.sampling_from_proto(request.sampling)
        if request.k < 1:
            raise ValueError(f"k must be >= 1, got {request.k}")
        proposal, seconds = await self.executor.timed(
            self.worker.propose, request.session_id, request.num_kept, list(request.new_token_ids), request.k, sampling
        )
        response = convert.proposal_to_proto(proposal)
        response.compute_ms = seconds * 1000
        return response

    @unary_errors
    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        self.worker.release(request.session_id)
        return pb.ReleaseResponse()
