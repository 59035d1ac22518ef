"""DraftService over gRPC: decode the request, call the worker on its model thread, encode."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import torch

from draft_service.lookup import LookupWorker
from draft_service.worker import DraftWorker, ProposeCall
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.core.types import Proposal
from specserve.models.pass_clock import with_pass_seconds
from specserve.placement import this_process, usable_cpu_count
from specserve.rpc import stream_errors, unary_errors
from specserve.worker import convert
from specserve.worker.batching import BatchQueue
from specserve.worker.servicer import SessionServicer, WorkerServicer
from specserve.worker.threads import TeamWidth

PROPOSE = "/specserve.v1.DraftService/Propose"  # the method a round call stands for, in the logs


class DraftServicer(SessionServicer, pb_grpc.DraftServiceServicer):
    executor_name = "draft-model"
    worker: DraftWorker | LookupWorker
    queue: BatchQueue[ProposeCall, tuple[Proposal, float]]  # with the batch's pass seconds
    cpu_threads: tuple[int, int] | None = None
    """On the CPU: (the draft's own share of the cores, every core it may use)."""
    team_width: TeamWidth
    """On the CPU: whether every core is faster now, for a batch that may take them."""

    def attach(self, worker: DraftWorker | LookupWorker) -> None:
        if isinstance(worker, LookupWorker):  # no model, no tokenizer: model_info says token-agnostic
            WorkerServicer.attach(self, worker)
            self.placement = this_process("cpu")
        else:
            super().attach(worker)
        if isinstance(worker, DraftWorker) and worker.loaded.device.type == "cpu":
            self.cpu_threads = (torch.get_num_threads(), max(torch.get_num_threads(), usable_cpu_count()))
            self.team_width = TeamWidth(*self.cpu_threads)
        propose_batch = with_pass_seconds(self.propose_batch)
        self.queue = BatchQueue(self.executor, propose_batch, lambda c: c.session_id, self.max_batch_size)

    def model_info(self) -> pb.ModelInfoResponse:
        if isinstance(self.worker, LookupWorker):
            return convert.lookup_info_to_proto(self.worker.name, self.placement)
        return super().model_info()

    def propose_batch(self, calls: list[ProposeCall]) -> list[Proposal | Exception]:
        """On the model thread. A batch whose targets all wait for it may run on every core: the orchestrator
        says so only when the draft shares its cores with a target that has nothing else to do. It does
        while that is measured faster (specserve/worker/threads.py: not on a machine whose cores are busy)."""
        if self.cpu_threads is None:
            return self.worker.propose_batch(calls)
        widen = all(call.target_idle for call in calls)
        threads = self.team_width.choose(len(calls)) if widen else self.cpu_threads[0]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        started = time.perf_counter()
        results = self.worker.propose_batch(calls)
        if widen:
            num_steps = max((len(r.token_ids) for r in results if isinstance(r, Proposal)), default=0)
            self.team_width.observe(len(calls), threads, time.perf_counter() - started, num_steps)
        return results

    @unary_errors
    async def Propose(self, request: pb.ProposeRequest, context: grpc.aio.ServicerContext) -> pb.ProposeResponse:
        return await self.propose(request)

    async def propose(self, request: pb.ProposeRequest) -> pb.ProposeResponse:
        """A Propose call, however it came; raises what the status mapping (specserve/rpc.py) answers."""
        sampling = convert.sampling_from_proto(request.sampling)
        if request.k < 1:
            raise ValueError(f"k must be >= 1, got {request.k}")
        if not 0.0 <= request.confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1], got {request.confidence_threshold}")
        call = ProposeCall(
            request.session_id, request.num_kept, list(request.new_token_ids), request.k, sampling,
            request.confidence_threshold, request.target_idle,
        )  # fmt: skip
        (proposal, pass_s), seconds, batch = await self.queue.submit(call)
        response = convert.proposal_to_proto(proposal)
        response.compute_ms, response.batch_size, response.pass_ms = seconds * 1000, len(batch), pass_s * 1000
        return response

    async def ProposeStream(
        self, requests: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResponse]:
        """A session's Propose calls as messages (SessionServicer.answer_rounds)."""
        async for response in self.answer_rounds(requests, context, self.Propose):
            yield response

    @stream_errors
    async def ProposeRounds(
        self, batches: AsyncIterator[pb.ProposeBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResults]:
        """Every session's Propose calls on one stream (specserve/worker/rounds.py)."""
        async for results in self.answer_batches(batches, lambda r, _: self.propose(r), pb.ProposeResults, PROPOSE):
            yield results
