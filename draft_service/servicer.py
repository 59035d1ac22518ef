"""DraftService over gRPC: decode the request, call the worker on its model thread, encode."""

from __future__ import annotations

import grpc

from draft_service.worker import DraftWorker
from protos import convert
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from protos.session_servicer import SessionServicer
from specserve.rpc import unary_errors


class DraftServicer(SessionServicer, pb_grpc.DraftServiceServicer):
    executor_name = "draft-model"
    worker: DraftWorker

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
