"""One request's speculative loop over the remote services, with optimistic pre-drafting.

While the target verifies window n, the draft already drafts window n + 1 as if all of window n is
accepted and the target's bonus token is the draft's own next guess. When that holds (often, at high
acceptance), the next window is ready the moment the verdict arrives; otherwise the guess is dropped
(the draft's KV cache is rolled back by the next commit) and the draft proposes afresh. A session whose
windows are seldom accepted whole stops pre-drafting while that saves less than the call costs
(orchestrator/predraft.py); a sampled one always pre-drafts, since a pre-draft draws from its seeded
generator and its output must not follow the host's timing. Output is
unchanged either way: every window is still verified by the target with the exact rule. On a draft and
a target that share CPU cores there is nothing to overlap: rounds run in turn instead, and the sessions
of a target replica draft together and verify together (orchestrator/turns.py).

A replica that fails mid-request costs the request nothing but time: the session moves to another
replica of the same role, which prefills again from the token history kept here. Without a draft
replica the request goes on target-only (and takes a draft back when one is free).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from orchestrator.admission import Admission
from orchestrator.config import OrchestratorConfig
from orchestrator.predraft import PredraftOdds
from orchestrator.remote import DraftClient, PassReport, TargetClient
from orchestrator.replicas import Replica, ReplicaPool
from orchestrator.turns import Phase
from specserve.adaptive import AdaptivePolicy
from specserve.core.loop import Decode, SpeculativeDecoder, StopConditions
from specserve.core.stats import SpeculationStats
from specserve.core.types import Proposal, SamplingParams, Verdict
from specserve.rpc import UnavailableError

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_CALL_ATTEMPTS = 4  # per call: the original, then up to three recoveries (re-prefill or move)
DRAFT_REATTACH_S = 2.0  # a request that lost its draft looks for a free draft replica this often
# A replica that answers these is failing (or gone); others are the request's own fault.
REPLICA_FAILURES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """One request as the service planned it; the orchestrator's settings come with it, not copies of them."""

    prompt_token_ids: list[int]
    k: int
    """Drafts per round; with `adaptive`, the most a round drafts."""
    sampling: SamplingParams
    stop: StopConditions
    max_context: int
    vocab_size: int
    config: OrchestratorConfig
    """Timeouts, confidence thresholds, shared-core turns (the request's own choices below win)."""
    pipelined: bool
    """Pre-draft the next window during verification (config.pipelined unless the caller chose)."""
    adaptive: bool
    """Each round's k follows acceptance, costs and batch size (the request left k to the server)."""


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
    num_draft_timeouts: int = 0
    num_target_reprefills: int = 0
    num_target_moves: int = 0
    failover_s: float = 0.0
    """Time spent recovering from failed replicas (moving and prefilling again)."""


class RemoteRequest:
    def __init__(
        self,
        target_pool: ReplicaPool,
        draft_pool: ReplicaPool | None,
        plan: RequestPlan,
        decode: Decode,
        admission: Admission | None = None,
    ) -> None:
        self.target_pool, self.draft_pool, self.plan = target_pool, draft_pool if plan.k > 0 else None, plan
        self.admission = admission
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
        self.target: Replica | None = None
        self.draft: Replica | None = None
        self._target_ready = self._draft_ready = False  # whether the replica holds this session
        self._num_prefills = 0
        self._draft_prefilling = False  # the first prefill has the draft's beside it
        self._first_token_id: int | None = None
        self._draft_lost_at = 0.0
        self._draft_length = 0  # context tokens the draft knows (its last proposal included)
        # leading context tokens the draft holds that match the request's: its next propose keeps those and
        # is sent the rest (rejected drafts dropped; tokens of target-only rounds included)
        self._draft_valid = len(plan.prompt_token_ids)
        self._predraft: asyncio.Task[tuple[Proposal, PassReport] | None] | None = None
        self._predraft_odds = PredraftOdds()
        self._round_ended = self._prefilled_s = 0.0  # when the last round ended, the replica's prefill clock then

    @property
    def context(self) -> list[int]:
        return self.plan.prompt_token_ids + self.decoder.result.token_ids

    async def stream(self) -> AsyncGenerator[Chunk, None]:
        admitted = await self.admission.acquire() if self.admission is not None else None  # may refuse
        try:
            if first := await self._prefill():
                yield Chunk(first, self.decoder.text_delta(), self.decoder)
            async for emitted in self._rounds():
                yield Chunk(emitted, self.decoder.text_delta(), self.decoder)
            yield Chunk([], self.decoder.text_delta(), self.decoder)
        finally:
            if self._predraft is not None and not self._predraft.done():
                self._predraft.cancel()
            logger.debug("session %s: %s", self.session_id, self.pipeline)
            try:  # a cancelled client (or disconnect) lands here too: its sessions are released at once
                await asyncio.shield(self._release())
            finally:
                if self.admission is not None and admitted is not None:
                    self.admission.release(admitted)

    async def _prefill(self) -> list[int]:
        """Prefill the target and the draft; returns what the first output token emits (chosen in the target's
        prefill, so that it reaches the client without waiting for a round)."""
        self.target = await self.target_pool.acquire(self.plan.config.failover_timeout_s)
        if self.target is None:
            raise UnavailableError(f"no target replica is serving (waited {self.plan.config.failover_timeout_s:.0f}s)")
        first_token = self.decoder.next_k() is not None  # the request has room for a token
        if self.draft_pool is None:
            await self._on_target(_nothing, first_token)
        else:  # both prefills at once: with long prompts this is most of the time to first token
            self.draft = self.draft_pool.try_acquire()
            # (at k = 0 the draft's prefill would only take hardware from the target's passes: the first round
            # that drafts catches the draft up instead)
            policy = self._adaptive_k()
            with_draft = (policy is None or policy.k > 0) and not self._alone_on_shared_cores()
            self._draft_prefilling = with_draft and self.draft is not None
            prefills = [self._on_target(_nothing, first_token)]
            if with_draft:
                prefills.append(self._on_draft(_nothing))
            # On the target's cores the prefills take a verify turn (Turns): beside a draft pass every call
            # slows down, and the rounds they hold up then stand still whatever their k.
            async with self._turn(Phase.VERIFY, late_ok=True):
                results = await asyncio.gather(*prefills, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        self.decoder.result.stats.observe_prefill(len(self.plan.prompt_token_ids), time.perf_counter() - self.started)
        if self._first_token_id is None:
            return []
        return self.decoder.apply_first(self._first_token_id)

    def _seed(self) -> int | None:
        """The request's seed for its first prefill; a fresh one derived from it for every later prefill,
        so a session rebuilt elsewhere does not replay the random numbers its first part used."""
        seed, self._num_prefills = self.plan.sampling.seed, self._num_prefills + 1
        if seed is None or self._num_prefills == 1:
            return seed
        return (seed * 1_000_003 + self._num_prefills) % (1 << 62)

    async def _on_target(self, call: Callable[[TargetClient], Awaitable[T]], first_token: bool = False) -> T:
        """`call` on the session's target replica, recovering the session first when that replica evicted it
        (prefill again) or failed (move to another replica, prefill there). `first_token`: the first prefill,
        which also chooses the first output token (into _first_token_id)."""
        error: grpc.aio.AioRpcError | None = None
        for _ in range(MAX_CALL_ATTEMPTS):
            assert self.target is not None
            client = self.target.client
            assert isinstance(client, TargetClient)
            try:
                if not self._target_ready:
                    sampling = self.plan.sampling if first_token else None
                    with self.target.prefilling() as timing:
                        first = await client.prefill(self.session_id, self.context, self._seed(), sampling)
                    if first_token and (policy := self._adaptive_k()) is not None:  # what prefills stall rounds by
                        policy.observe_target_prefill(
                            timing.seconds, len(self.context), self._draft_prefilling, timing.alone, time.perf_counter()
                        )
                    self._first_token_id = first
                    self._target_ready = True
                return await call(client)
            except grpc.aio.AioRpcError as e:
                error = e
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    self.pipeline.num_target_reprefills += 1
                    self._target_ready = False
                    continue
                if e.code() not in REPLICA_FAILURES:
                    raise
                await self._move_target(e)
        assert error is not None
        raise UnavailableError(f"the target failed {MAX_CALL_ATTEMPTS} times for this request; last: {error.details()}")

    async def _move_target(self, error: grpc.aio.AioRpcError) -> None:
        started = time.perf_counter()
        assert self.target is not None
        self._abandon(self.target_pool, self.target, error)
        self.target = None
        self.target = await self.target_pool.acquire(self.plan.config.failover_timeout_s)
        if self.target is None:
            raise UnavailableError(
                f"the target replica failed ({error.code().name}) and no other served within "
                f"{self.plan.config.failover_timeout_s:.0f}s"
            )
        self._target_ready = False
        self.pipeline.num_target_moves += 1
        self.pipeline.failover_s += time.perf_counter() - started
        logger.info("session %s moved to target replica %s", self.session_id, self.target.address)

    async def _on_draft(self, call: Callable[[DraftClient], Awaitable[T]]) -> T | None:
        """`call` on the session's draft replica, recovering like _on_target but never waiting for a replica:
        None when no draft can answer now (the round goes on target-only)."""
        for _ in range(MAX_CALL_ATTEMPTS):
            if self.draft is None:
                return None
            client = self.draft.client
            assert isinstance(client, DraftClient)
            try:
                if not self._draft_ready:
                    context = self.context
                    with self.draft.prefilling() as timing:
                        await client.prefill(self.session_id, context, self._seed())
                    if timing.alone and (policy := self._adaptive_k()) is not None:  # what a draft catching up costs
                        policy.observe_draft_prefill(timing.seconds, len(context), time.perf_counter())
                    self._draft_ready, self._draft_length, self._draft_valid = True, len(context), len(context)
                return await call(client)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    self._draft_ready = False
                    continue
                if e.code() not in REPLICA_FAILURES:  # the draft refuses this request: go on without it
                    logger.warning("session %s: the draft refused (%s); continuing target-only", self.session_id, e)
                    break
                assert self.draft_pool is not None
                self.pipeline.num_draft_failures += 1
                self._abandon(self.draft_pool, self.draft, e)
                self.draft, self._draft_ready = self.draft_pool.try_acquire(), False
                if self.draft is None:
                    logger.warning("session %s: no draft replica left (%s); continuing target-only", self.session_id, e)
                    self._draft_lost_at = time.perf_counter()
        self._abandon_draft()
        return None

    def _abandon(self, pool: ReplicaPool, replica: Replica, error: grpc.aio.AioRpcError) -> None:
        if error.code() in REPLICA_FAILURES:
            pool.mark_failed(replica, error)
        asyncio.ensure_future(_release_quietly(replica, self.session_id))  # a live replica frees the cache
        pool.release(replica)

    def _abandon_draft(self) -> None:
        if self.draft is not None and self.draft_pool is not None:
            asyncio.ensure_future(_release_quietly(self.draft, self.session_id))
            self.draft_pool.release(self.draft)
        self.draft, self._draft_lost_at = None, time.perf_counter()

    def _reattach_draft(self) -> None:
        """A request running target-only after losing its draft takes a free draft replica back."""
        if self.draft is None and self.draft_pool is not None:
            if time.perf_counter() - self._draft_lost_at >= DRAFT_REATTACH_S:
                self.draft, self._draft_ready = self.draft_pool.try_acquire(), False
                self._draft_lost_at = time.perf_counter()

    async def _rounds(self) -> AsyncIterator[list[int]]:
        decoder = self.decoder
        ready: Proposal | None = None  # a pre-drafted window that turned out right
        self._round_ended, self._prefilled_s = time.perf_counter(), self._prefill_clock()
        while (k := self._next_k()) is not None:
            chosen_k, t0 = self.decoder.k, time.perf_counter()  # the policy's k (k: shrunk near the budget)
            if chosen_k == 0 and self.plan.config.target_only_run_tokens > 1:
                ready = None  # a window pre-drafted before the switch to target-only goes unused
                async for emitted in self._run():
                    yield emitted
                continue
            proposal = ready if ready is not None else await self._propose(k)
            probs = None if proposal.probs is None else proposal.probs[:k]
            proposal = Proposal(proposal.token_ids[:k], probs, proposal.source)
            t1 = time.perf_counter()
            context_length = decoder.context_length
            predraft = self._start_predraft(proposal) if self._pipelined() else None
            verdict = await self._verify(proposal)
            t2 = time.perf_counter()
            ready = await self._settle_predraft(predraft, proposal, verdict)
            self._predraft_odds.observe_window(len(proposal.token_ids), verdict.num_accepted)
            # the draft held the context (an empty proposal too, e.g. a lookup that found no match); its
            # accepted drafts match
            if ready is None and (proposal.token_ids or self._draft_length == context_length):
                self._draft_valid = context_length + verdict.num_accepted
            if (policy := self._adaptive_k()) is not None:  # the whole round, waits and overlap included
                now, clock = time.perf_counter(), self._prefill_clock()
                policy.observe(
                    self._batch_size(), chosen_k, verdict.num_accepted, now - self._round_ended, now,
                    num_asked=k, num_drafted=len(proposal.token_ids), stalled_s=clock - self._prefilled_s,
                    draft_s=t1 - t0, verify_s=t2 - t1, draft_lag=self._draft_lag(),
                )  # fmt: skip
                self._round_ended, self._prefilled_s = now, clock
            emitted = decoder.apply(proposal, verdict, t1 - t0, t2 - t1)
            if emitted:
                yield emitted

    async def _run(self) -> AsyncIterator[list[int]]:
        """Target-only tokens decoded by the target back to back in one call (a run), each emitted as it comes:
        a round trip per token is host overhead that nothing overlaps at k = 0. The run ends at the plan's
        run length (under adaptive k, which decides between runs), the budget or a stop token; a stop string
        ends it early (the call is cancelled)."""
        decoder, config = self.decoder, self.plan.config
        if self._draft_length == decoder.context_length:  # the draft holds the context: what it lacks starts here
            self._draft_valid = decoder.context_length
        # with no policy to consult between runs (a fixed k = 0), the run lasts the request
        unbounded = self._adaptive_k() is None and config.target_only_run_tokens > 1
        first = decoder.context_length
        budget = decoder.room() if unbounded else min(config.target_only_run_tokens, decoder.room())
        arrived: asyncio.Queue[list[int] | None] = asyncio.Queue()

        def hear(token_ids: list[int]) -> None:  # applied at once: a recovery prefills the context with them
            arrived.put_nowait(decoder.apply_run(token_ids))

        async def run(client: TargetClient) -> PassReport | None:
            num_tokens = budget - (decoder.context_length - first)  # what is left after a recovery mid-run
            if num_tokens <= 0 or decoder.result.finish_reason is not None:
                return None
            eos = self.plan.stop.eos_token_ids
            return await client.decode_run(self.session_id, num_tokens, eos, self.plan.sampling, hear)

        async def call() -> PassReport | None:
            try:
                async with self._turn(Phase.VERIFY, late_ok=True):
                    return await self._on_target(run)
            finally:
                arrived.put_nowait(None)

        started = time.perf_counter()
        task = asyncio.ensure_future(call())
        try:
            while (emitted := await arrived.get()) is not None:
                if emitted:
                    yield emitted
                if decoder.result.finish_reason is not None and not task.done():
                    return  # a stop string: what the run decodes on is not needed
            report = task.result()  # raises why the run failed
        finally:
            task.cancel()
        seconds, stats = time.perf_counter() - started, decoder.result.stats
        stats.target_s += seconds
        if report is not None:
            stats.transport_s += seconds - report.compute_s
            stats.target_pass_s += report.pass_s
        self._observe_run(decoder.context_length - first, seconds)

    def _observe_run(self, num_tokens: int, verify_s: float) -> None:
        """A run, told to the adaptive policy as the target-only rounds it stands for, a token each."""
        if (policy := self._adaptive_k()) is None or num_tokens < 1:
            return
        now, clock = time.perf_counter(), self._prefill_clock()
        seconds, stalled_s = now - self._round_ended, clock - self._prefilled_s
        for _ in range(num_tokens):
            policy.observe(
                self._batch_size(), 0, 0, seconds / num_tokens, now, num_asked=0, num_drafted=0,
                stalled_s=stalled_s / num_tokens, draft_s=0.0, verify_s=verify_s / num_tokens,
                draft_lag=self._draft_lag(),
            )  # fmt: skip
        self._round_ended, self._prefilled_s = now, clock

    def _next_k(self) -> int | None:
        """The decoder's next window, its k chosen by the adaptive policy first when there is one."""
        if (policy := self._adaptive_k()) is not None:
            self.decoder.k = policy.choose(self._batch_size(), time.perf_counter())
        return self.decoder.next_k()

    def _adaptive_k(self) -> AdaptivePolicy | None:
        """The policy of the session's target replica, if this request follows one."""
        if self.plan.adaptive and self.target is not None and self.plan.k > 0:
            return self.target.adaptive_k(self.plan.k)
        return None

    def _draft_lag(self) -> int:
        """Context tokens the session's draft lacks (all of them before its first prefill)."""
        return self.decoder.context_length - (self._draft_valid if self.draft is not None and self._draft_ready else 0)

    def _prefill_clock(self) -> float:
        return self.target.prefill_clock() if self.target is not None else 0.0

    def _batch_size(self) -> int:
        return max(1, self.target.num_sessions if self.target is not None else 1)

    def _pipelined(self) -> bool:
        return self.plan.pipelined and not self._on_shared_cores()

    def _on_shared_cores(self) -> bool:
        """A draft and a target that compute on the same CPU cores: a pre-draft would only slow the
        verification beside it, so rounds run in turn, and the replica's sessions take turns (Turns)."""
        if not self.plan.config.yield_shared_cores or self.draft is None or self.target is None:
            return False
        draft, target = self.draft.info, self.target.info
        if draft is None or target is None or draft.placement is None or target.placement is None:
            return False
        return draft.placement.shares_cores_with(target.placement)

    def _alone_on_shared_cores(self) -> bool:
        """Whether the session's draft shares the target's cores and no other session is on the target. Then
        the draft's prefill beside the target's would only delay the first token (0.6 s instead of 0.4 s
        here); the first round that drafts catches the draft up instead. In company it runs beside the
        target's, in the stall that one causes the other sessions anyway (in their draft turns, k = 4 at 16
        clients served 0.93x target-only instead of 0.98-1.04x)."""
        return self._on_shared_cores() and self.target is not None and self.target.num_sessions <= 1

    def _turn(self, phase: Phase, late_ok: bool = False) -> contextlib.AbstractAsyncContextManager[None]:
        """The session's calls of `phase`, in the turns of its target replica's sessions on shared cores."""
        if self.target is None or not self._on_shared_cores():
            return contextlib.nullcontext()
        return self.target.turns().take(phase, self.session_id, late_ok)

    async def _propose(self, k: int) -> Proposal:
        self._reattach_draft()
        if self.draft is None or k == 0:
            return Proposal([])
        started = time.perf_counter()

        shared_cores = self._on_shared_cores()  # then the target waits for the proposals: Turns
        threshold = self.plan.config.draft_confidence_threshold
        if not self._pipelined():  # a round run in turn
            threshold = max(threshold, self.plan.config.sequential_confidence_threshold)

        async def propose(client: DraftClient) -> tuple[Proposal, PassReport]:
            num_kept = min(self._draft_valid, self._draft_length)
            new_token_ids = self.context[num_kept:]
            try:
                result = await client.propose(
                    self.session_id, num_kept, new_token_ids, k, self.plan.sampling, self.plan.vocab_size,
                    timeout_s=self.plan.config.draft_timeout_s, confidence_threshold=threshold,
                    target_idle=shared_cores,
                )  # fmt: skip
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise _DraftTooSlowError from error
                raise
            self._draft_length = num_kept + len(new_token_ids) + len(result[0].token_ids)
            return result

        try:
            async with self._turn(Phase.DRAFT):
                result = await self._on_draft(propose)
        except _DraftTooSlowError:
            # Slow, not dead: the replica stays in service. This round goes target-only; the late call may
            # still change the draft's session, so the request lets it go and takes a draft back (prefilled
            # afresh) after DRAFT_REATTACH_S.
            self.pipeline.num_draft_timeouts += 1
            logger.warning(
                "session %s: the draft took over %.2fs to propose; this round goes target-only",
                self.session_id, self.plan.config.draft_timeout_s,
            )  # fmt: skip
            self._abandon_draft()
            return Proposal([])
        if result is None:
            return Proposal([])
        proposal, report = result
        stats, seconds = self.decoder.result.stats, time.perf_counter() - started
        stats.transport_s += seconds - report.compute_s
        stats.draft_pass_s += report.pass_s
        self._predraft_odds.observe_propose(seconds, report.compute_s)
        return proposal

    def _start_predraft(self, proposal: Proposal) -> asyncio.Task[tuple[Proposal, PassReport] | None] | None:
        """Draft the window after this one, guessing all of it is accepted plus the draft's own bonus. As
        long as the adaptive policy's k now, not this round's: a window pre-drafted at this round's length
        kept a raised k from taking effect until the first rejection, which at a small k with high
        acceptance could be many rounds, and the policy's explorations of deeper windows measured nothing."""
        policy = self._adaptive_k()
        k = policy.k if policy is not None else len(proposal.token_ids)
        if self.draft is None or not proposal.token_ids or k == 0:
            return None
        # a sampled pre-draft draws from the session's generator, hit or miss: skipped by measured odds, a
        # seeded request's output would follow the host's timing
        if self.plan.sampling.greedy and not self._predraft_odds.pays():
            return None
        self.pipeline.num_predrafts += 1
        client = self.draft.client
        assert isinstance(client, DraftClient)
        self._predraft = asyncio.ensure_future(self._predraft_call(client, self._draft_length, k + 1))
        return self._predraft

    async def _predraft_call(self, client: DraftClient, num_kept: int, k: int) -> tuple[Proposal, PassReport] | None:
        """A failed guess costs nothing: the next propose recovers the session or drops the draft."""
        config = self.plan.config
        try:
            return await client.propose(
                self.session_id, num_kept, [], k, self.plan.sampling, self.plan.vocab_size,
                timeout_s=config.draft_timeout_s, confidence_threshold=config.draft_confidence_threshold,
            )  # fmt: skip
        except grpc.aio.AioRpcError as error:
            logger.debug("pre-draft failed for session %s: %s", self.session_id, error)
            return None

    async def _settle_predraft(
        self,
        predraft: asyncio.Task[tuple[Proposal, PassReport] | None] | None,
        proposal: Proposal,
        verdict: Verdict,
    ) -> Proposal | None:
        """The next window if the guess held, else None (the draft then proposes afresh)."""
        if predraft is None:
            return None
        result = await predraft
        if result is None:
            return None
        guess, report = result  # [bonus guess, next window...]
        self._draft_length += len(guess.token_ids)
        if not guess.token_ids:  # a drafter may propose nothing (a lookup without a match)
            return None
        if verdict.num_accepted < len(proposal.token_ids) or verdict.token_ids[-1] != guess.token_ids[0]:
            return None
        if len(guess.token_ids) == 1:  # the draft stopped after the bonus guess (low confidence): no window
            return None
        self.pipeline.num_predraft_hits += 1
        self.decoder.result.stats.draft_hidden_s += report.compute_s
        return Proposal(guess.token_ids[1:], None if guess.probs is None else guess.probs[1:], guess.source)

    async def _verify(self, proposal: Proposal) -> Verdict:
        started = time.perf_counter()
        async with self._turn(Phase.VERIFY, late_ok=not proposal.token_ids):
            verdict, report = await self._on_target(lambda c: c.verify(self.session_id, proposal, self.plan.sampling))
        stats = self.decoder.result.stats
        stats.transport_s += time.perf_counter() - started - report.compute_s
        stats.target_pass_s += report.pass_s
        return verdict

    async def _release(self) -> None:
        for pool, replica in ((self.target_pool, self.target), (self.draft_pool, self.draft)):
            if replica is not None and pool is not None:
                pool.release(replica)
        held = [r for r in (self.target, self.draft) if r is not None]
        await asyncio.gather(*(_release_quietly(r, self.session_id) for r in held))


class _DraftTooSlowError(Exception):
    """A propose missed the plan's draft_timeout_s (distinct from a failed replica)."""


async def _nothing(client: object) -> None:
    return None


async def _release_quietly(replica: Replica, session_id: str) -> None:
    try:
        await replica.client.release(session_id)
    except grpc.aio.AioRpcError as error:
        logger.debug("release of %s on %s failed: %s", session_id, replica.address, error.code())
