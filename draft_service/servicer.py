"""DraftService over gRPC: decode the request, call the worker on its model thread, encode."""

from __future__ import annotations

import grpc

from draft_service.worker import DraftWorker, ProposeCall
from protos import convert
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from protos.session_servicer import SessionServicer
from specserve.core.types import Proposal
from specserve.rpc import BatchQueue, unary_errors


class DraftServicer(SessionServicer, pb_grpc.DraftServiceServicer):
    executor_name = "draft-model"
    worker: DraftWorker
    queue: BatchQueue[ProposeCall, Proposal]

    def attach(self, worker: DraftWorker) -> None:
        super().attach(worker)
        self.queue = BatchQueue(self.executor, worker.propose_batch, lambda c: c.session_id, self.max_batch_size)

    @unary_errors
    async def Propose(self, request: pb.ProposeRequest, context: grpc.aio.ServicerContext) -> pb.ProposeResponse:
        sampling = convert.sampling_from_proto(request.sampling)
        if request.k < 1:
            raise ValueError(f"k must be >= 1, got {request.k}")
        if not 0.0 <= request.confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1], got {request.confidence_threshold}")
        call = ProposeCall(
            request.session_id, request.num_kept, list(request.new_token_ids), request.k, sampling,
            request.confidence_threshold,
        )  # fmt: skip
        proposal, seconds, batch = await self.queue.submit(call)
        response = convert.proposal_to_proto(proposal)
        response.compute_ms, response.batch_size = seconds * 1000, len(batch)
        return response
