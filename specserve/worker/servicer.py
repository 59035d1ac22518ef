"""The servicer scaffolding both roles share: the worker that arrives once its model has loaded, and the
RPCs of every session-keeping worker (model info, prefill, release)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from protos import specserve_pb2 as pb
from specserve.core.types import Proposal
from specserve.models.tokenizers import TokenizerSpec
from specserve.placement import Placement, this_process
from specserve.rpc import UnavailableError, unary_errors
from specserve.worker import convert, rounds
from specserve.worker.executor import ModelExecutor


class WorkerServicer:
    """Base of the draft and target servicers: the worker arrives once its model has loaded."""

    executor_name = "model"

    def __init__(self) -> None:
        self.executor = ModelExecutor(self.executor_name)
        self._worker: Any = None
        self.stopping = False
        """The server is stopping: as it refuses new calls, the round streams refuse their next rounds."""

    def attach(self, worker: Any) -> None:
        self._worker = worker

    @property
    def worker(self) -> Any:
        if self._worker is None:
            raise UnavailableError("the model is still loading; retry shortly")
        return self._worker


class SessionServicer(WorkerServicer):
    """Base of DraftServicer and TargetServicer: a worker with sessions keyed by id."""

    fingerprint = ""
    placement: Placement
    chooses_first_token = False  # whether Prefill may score the prompt's last token (a target's sessions)

    def __init__(self, max_batch_size: int = 16, prefill_chunk_tokens: int = 256) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.prefill_chunk_tokens = prefill_chunk_tokens

    def attach(self, worker: Any) -> None:
        super().attach(worker)
        self.fingerprint = TokenizerSpec.of(worker.loaded.tokenizer, worker.loaded.padded_vocab_size).fingerprint()
        self.placement = this_process(str(worker.loaded.device))

    def model_info(self) -> pb.ModelInfoResponse:
        return convert.model_info_to_proto(self.worker.loaded, self.fingerprint, self.placement)

    @unary_errors
    async def GetModelInfo(
        self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfoResponse:
        info = self.model_info()
        info.num_sessions = len(self.worker.sessions)
        return info

    @unary_errors
    async def Prefill(self, request: pb.PrefillRequest, context: grpc.aio.ServicerContext) -> pb.PrefillResponse:
        """One chunk of the prompt per pass on the model thread, so that the other sessions' Propose or
        Verify passes run in between (a 4k-token prompt in one pass stalled another stream for 58 s here). A caller
        that leaves stops it after the current chunk, and the session is only stored once complete."""
        seed = request.seed if request.HasField("seed") else None
        prompt_token_ids = list(request.prompt_token_ids)
        session = self.worker.open_session(prompt_token_ids, seed)
        first_token = convert.sampling_from_proto(request.first_token) if request.HasField("first_token") else None
        if first_token is not None and not self.chooses_first_token:
            raise ValueError("first_token: only a target service chooses a first output token")
        # choosing the first token, the last chunk is left to the pass that scores the last prompt token
        num_left = 1 if first_token is None else (len(prompt_token_ids) - 1) % self.prefill_chunk_tokens + 1
        while not await self.executor.run(session.prefill, self.prefill_chunk_tokens, num_left, background=True):
            pass
        response = pb.PrefillResponse()
        if first_token is not None:
            verdict = await self.executor.run(session.verify, Proposal([]), first_token, background=True)
            response.first_token_id = verdict.token_ids[0]
        self.worker.sessions.put(request.session_id, session)
        return response

    async def answer_rounds(
        self,
        requests: AsyncIterator[Any],
        context: grpc.aio.ServicerContext,
        answer: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    ) -> AsyncIterator[Any]:
        """A session's round stream: each request answered as the unary `answer` does, in order; an error
        ends the stream with its status. Once the worker is stopping the next round is refused UNAVAILABLE,
        as a unary call would be, so the session moves to another replica instead of riding out the grace."""
        async for request in requests:
            if self.stopping:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the worker is shutting down")
            yield await answer(request, context)

    def answer_batches(
        self,
        batches: AsyncIterator[Any],
        answer: Callable[[Any, rounds.Partial], Awaitable[Any]],
        results_type: Any,
        method: str,
    ) -> AsyncIterator[Any]:
        """Every session's round calls on one stream (specserve/worker/rounds.py): each answered as `answer`
        does, refused UNAVAILABLE once the worker is stopping."""
        return rounds.answer_batches(batches, answer, results_type, method, lambda: self.stopping)

    @unary_errors
    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        self.worker.release(request.session_id)
        return pb.ReleaseResponse()
