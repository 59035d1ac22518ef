"""TargetService over gRPC: decode the request, call the worker on its model thread, encode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.core.types import Verdict
from specserve.models.pass_clock import with_pass_seconds
from specserve.rpc import stream_errors, unary_errors
from specserve.worker import convert
from specserve.worker.batching import BatchQueue
from specserve.worker.rounds import Partial
from specserve.worker.servicer import SessionServicer
from target_service.worker import TargetWorker, VerifyCall

VERIFY = "/specserve.v1.TargetService/Verify"  # the method a round call stands for, in the logs


class TargetServicer(SessionServicer, pb_grpc.TargetServiceServicer):
    executor_name = "target-model"
    chooses_first_token = True
    worker: TargetWorker
    queue: BatchQueue[VerifyCall, tuple[Verdict, float]]  # with the batch's pass seconds

    def attach(self, worker: TargetWorker) -> None:
        super().attach(worker)
        verify_batch = with_pass_seconds(worker.verify_batch)
        self.queue = BatchQueue(self.executor, verify_batch, lambda c: c.session_id, self.max_batch_size)

    @unary_errors
    async def Verify(self, request: pb.VerifyRequest, context: grpc.aio.ServicerContext) -> pb.VerifyResponse:
        return await self.verify(request)

    async def verify(self, request: pb.VerifyRequest, partial: Partial | None = None) -> pb.VerifyResponse:
        """A Verify call, however it came; raises what the status mapping (specserve/rpc.py) answers. A run
        (num_tokens > 1) is the same target-only call again after each token, in the next batched pass, its
        tokens sent ahead through `partial` (round streams) as they are decoded."""
        sampling = convert.sampling_from_proto(request.sampling)
        draft_probs = request.draft_probs if request.HasField("draft_probs") else None
        proposal = convert.proposal_from_proto(
            list(request.draft_token_ids), draft_probs, self.worker.loaded.vocab_size
        )
        call = VerifyCall(request.session_id, proposal, sampling)
        num_tokens = self.worker.check_run(call, request.num_tokens)
        stop_token_ids = frozenset(request.stop_token_ids)
        response = pb.VerifyResponse()
        loop = asyncio.get_running_loop()

        def again(result: tuple[Verdict, float], seconds: float, batch: list[VerifyCall]) -> bool:
            """After each pass, on the model thread: its tokens and figures added; whether the run goes on."""
            verdict, pass_s = result
            response.token_ids.extend(verdict.token_ids)
            response.num_accepted = verdict.num_accepted
            response.compute_ms += seconds * 1000
            response.pass_ms += pass_s * 1000
            response.batch_size = max(response.batch_size, len(batch))
            response.batch_tokens = max(response.batch_tokens, sum(len(c.proposal.token_ids) + 1 for c in batch))
            if len(response.token_ids) >= num_tokens or verdict.token_ids[-1] in stop_token_ids:
                return False
            if partial is not None:
                loop.call_soon_threadsafe(partial, pb.VerifyResponse(token_ids=verdict.token_ids))
            return True

        await self.queue.submit(call, again)
        return response

    async def VerifyStream(
        self, requests: AsyncIterator[pb.VerifyRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.VerifyResponse]:
        """A session's Verify calls as messages (SessionServicer.answer_rounds)."""
        async for response in self.answer_rounds(requests, context, self.Verify):
            yield response

    @stream_errors
    async def VerifyRounds(
        self, batches: AsyncIterator[pb.VerifyBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.VerifyResults]:
        """Every session's Verify calls on one stream (specserve/worker/rounds.py)."""
        async for results in self.answer_batches(batches, self.verify, pb.VerifyResults, VERIFY):
            yield results
