"""The RPCs the draft and target services share (model info, prefill, release), in one place."""

from __future__ import annotations

from typing import Any

import grpc

from protos import convert
from protos import specserve_pb2 as pb
from specserve.models.tokenizers import TokenizerSpec
from specserve.rpc import WorkerServicer, unary_errors


class SessionServicer(WorkerServicer):
    """Base of DraftServicer and TargetServicer: a worker with sessions keyed by id."""

    fingerprint = ""

    def __init__(self, max_batch_size: int = 16) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size

    def attach(self, worker: Any) -> None:
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
    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        self.worker.release(request.session_id)
        return pb.ReleaseResponse()
