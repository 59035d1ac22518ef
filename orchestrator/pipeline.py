"""One request's speculative loop over the remote services, with optimistic pre-drafting.

While the target verifies window n, the draft already drafts window n + 1 as if all of window n is
accepted and the target's bonus token is the draft's own next guess. When that holds (often, at high
acceptance), the next window is ready the moment the verdict arrives; otherwise the guess is dropped
(the draft's KV cache is rolled back by the next commit) and the draft proposes afresh. Output is
unchanged either way: every window is still verified by the target with the exact rule.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from orchestrator.remote import DraftClient, TargetClient
from specserve.core.loop import Decode, SpeculativeDecoder, StopConditions
from specserve.core.stats import SpeculationStats
from specserve.core.types import Proposal, SamplingParams, Verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestPlan:
    prompt_token_ids: list[int]
    k: int
    sampling: SamplingParams
    stop: StopConditions
    max_context: int
    vocab_size: int
    pipelined: bool = True


@dataclass(frozen=True, slots=True)
class Chunk:
    token_ids: list[int]
    text: str
    decoder: SpeculativeDecoder  # .result is final after the last chunk


@dataclass(slots=True)
class PipelineStats:
    num_predrafts: int = 0
    num_predraft_hits: int = 0
    num_draft_failures: int = 0
    num_target_reprefills: int = 0


class _DraftLost(Exception):
    """The draft could not answer; the request continues target-only."""


class RemoteRequest:
    def __init__(self, draft: DraftClient | None, target: TargetClient, plan: RequestPlan, decode: Decode) -> None:
        self.draft, self.target, self.plan = draft if plan.k > 0 else None, target, plan
        self.session_id = uuid.uuid4().hex
        self.started = time.perf_counter()
        self.decoder = SpeculativeDecoder(
            None,
            None,
            num_prompt_tokens=len(plan.prompt_token_ids),
            k=plan.k,
            sampling=plan.sampling,
            stop=plan.stop,
            max_context=plan.max_context,
            decode=decode,
            stats=SpeculationStats(),
            started_at=self.started,
        )
        self.pipeline = PipelineStats()
        self._draft_length = 0  # context tokens the draft knows (its last proposal included)
        self._commit: tuple[int, list[int]] = (len(plan.prompt_token_ids), [])  # for the draft's next propose
        self._predraft: asyncio.Task[Proposal | None] | None = None

    @property
    def context(self) -> list[int]:
        return self.plan.prompt_token_ids + self.decoder.result.token_ids

    async def stream(self) -> AsyncIterator[Chunk]:
        try:
            await self._prefill()
            async for emitted in self._rounds():
                yield Chunk(emitted, self.decoder.text_delta(), self.decoder)
            yield Chunk([], self.decoder.text_delta(), self.decoder)
        finally:
            if self._predraft is not None and not self._predraft.done():
                self._predraft.cancel()
            logger.debug("session %s: %s", self.session_id, self.pipeline)
            await asyncio.shield(self._release())

    async def _prefill(self) -> None:
        prompt, seed = self.plan.prompt_token_ids, self.plan.sampling.seed
        target_prefill = self.target.prefill(self.session_id, prompt, seed)
        if self.draft is None:
            await target_prefill
        else:  # both prefills at once: with long prompts this is most of the time to first token
            results = await asyncio.gather(
                target_prefill, self.draft.prefill(self.session_id, prompt, seed), return_exceptions=True
            )
            if isinstance(results[0], BaseException):
                raise results[0]
            if isinstance(results[1], BaseException):
                self._lose_draft(results[1])
            self._draft_length = len(prompt)
        self.decoder.result.stats.observe_prefill(len(prompt), time.perf_counter() - self.started)

    async def _rounds(self) -> AsyncIterator[list[int]]:
        decoder = self.decoder
        ready: Proposal | None = None  # a pre-drafted window that turned out right
        while (k := decoder.next_k()) is not None:
            t0 = time.perf_counter()
            proposal = ready if ready is not None else await self._propose(k)
            proposal = Proposal(proposal.token_ids[:k], None if proposal.probs is None else proposal.probs[:k])
            t1 = time.perf_counter()
            context_length = decoder.context_length
            predraft = self._start_predraft(proposal) if self.plan.pipelined else None
            verdict = await self._verify(proposal)
            t2 = time.perf_counter()
            ready = await self._settle_predraft(predraft, proposal, verdict)
            if ready is None:  # the draft's next propose first drops rejected drafts, appends the new token
                self._commit = (context_length + verdict.num_accepted, verdict.token_ids[-1:])
            emitted = decoder.apply(proposal, verdict, t1 - t0, t2 - t1)
            if emitted:
                yield emitted

    async def _propose(self, k: int) -> Proposal:
        if self.draft is None or k == 0:
            return Proposal([])
        num_kept, new_token_ids = self._commit
        num_kept = min(num_kept, self._draft_length)
        started = time.perf_counter()
        try:
            proposal, compute_s = await self._call_draft(num_kept, new_token_ids, k)
        except _DraftLost:
            return Proposal([])
        self.decoder.result.stats.transport_s += time.perf_counter() - started - compute_s
        self._draft_length = num_kept + len(new_token_ids) + len(proposal.token_ids)
        return proposal

    async def _call_draft(self, num_kept: int, new_token_ids: list[int], k: int) -> tuple[Proposal, float]:
        assert self.draft is not None
        for attempt in range(2):
            try:
                return await self.draft.propose(
                    self.session_id, num_kept, new_token_ids, k, self.plan.sampling, self.plan.vocab_size
                )
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND and attempt == 0:  # evicted: prefill again
                    try:
                        await self.draft.prefill(self.session_id, self.context, self.plan.sampling.seed)
                    except grpc.aio.AioRpcError as prefill_error:
                        self._lose_draft(prefill_error)
                        raise _DraftLost from prefill_error
                    num_kept, new_token_ids = len(self.context), []
                    continue
                self._lose_draft(error)
                raise _DraftLost from error
        raise _DraftLost

    def _lose_draft(self, error: BaseException) -> None:
        logger.warning("draft unavailable for session %s (%s); continuing target-only", self.session_id, error)
        self.pipeline.num_draft_failures += 1
        self.draft = None

    def _start_predraft(self, proposal: Proposal) -> asyncio.Task[Proposal | None] | None:
        """Draft the window after this one, guessing all of it is accepted plus the draft's own bonus."""
        k = len(proposal.token_ids)
        if self.draft is None or k == 0:
            return None
        self.pipeline.num_predrafts += 1
        self._predraft = asyncio.ensure_future(self._predraft_call(self._draft_length, k + 1))
        return self._predraft

    async def _predraft_call(self, num_kept: int, k: int) -> Proposal | None:
        """A failed guess costs nothing: the next propose recovers the session or drops the draft."""
        assert self.draft is not None
        try:
            proposal, _ = await self.draft.propose(
                self.session_id, num_kept, [], k, self.plan.sampling, self.plan.vocab_size
            )
        except grpc.aio.AioRpcError as error:
            logger.debug("pre-draft failed for session %s: %s", self.session_id, error)
            return None
        return proposal

    async def _settle_predraft(
        self, predraft: asyncio.Task[Proposal | None] | None, proposal: Proposal, verdict: Verdict
    ) -> Proposal | None:
        """The next window if the guess held, else None (the draft then proposes afresh)."""
        if predraft is None:
            return None
        guess = await predraft  # [bonus guess, next window...]
        if guess is None:
            return None
        self._draft_length += len(guess.token_ids)
        if verdict.num_accepted < len(proposal.token_ids) or verdict.token_ids[-1] != guess.token_ids[0]:
            return None
        self.pipeline.num_predraft_hits += 1
        return Proposal(guess.token_ids[1:], None if guess.probs is None else guess.probs[1:])

    async def _verify(self, proposal: Proposal) -> Verdict:
        started = time.perf_counter()
        try:
            verdict, compute_s = await self.target.verify(self.session_id, proposal, self.plan.sampling)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            # the target evicted the session: rebuild it from the history and verify again
            self.pipeline.num_target_reprefills += 1
            await self.target.prefill(self.session_id, self.context, self.plan.sampling.seed)
            started = time.perf_counter()
            verdict, compute_s = await self.target.verify(self.session_id, proposal, self.plan.sampling)
        self.decoder.result.stats.transport_s += time.perf_counter() - started - compute_s
        return verdict

    async def _release(self) -> None:
        clients = [c for c in (self.target, self.draft) if c is not None]
        results = await asyncio.gather(*(c.release(self.session_id) for c in clients), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                logger.debug("release of %s failed: %s", self.session_id, result)
