"""The RPCs the draft and target services share (model info, prefill, release), in one place."""

from __future__ import annotations

import asyncio
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
        info = convert.model_info_to_proto(self.worker.loaded, self.fingerprint)
        info.num_sessions = len(self.worker.sessions)
        return info

    @unary_errors
    async def Prefill(self, request: pb.PrefillRequest, context: grpc.aio.ServicerContext) -> pb.PrefillResponse:
        seed = request.seed if request.HasField("seed") else None
        prefill = asyncio.ensure_future(
            self.executor.run(self.worker.prefill, request.session_id, list(request.prompt_token_ids), seed)
        )
        try:
            await asyncio.shield(prefill)
        except asyncio.CancelledError:  # the caller left (and may have sent Release already): drop the session

            def drop(done: asyncio.Future[None]) -> None:
                if not done.cancelled():
                    done.exception()  # retrieved: a failed prefill left no session anyway
                self.worker.release(request.session_id)

            prefill.add_done_callback(drop)
            raise
        return pb.PrefillResponse()

    @unary_errors
    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        self.worker.release(request.session_id)
        return pb.ReleaseResponse()
