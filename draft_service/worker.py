"""DraftWorker: the draft model and its per-request sessions (KV caches). No transport here."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specserve.core.types import Proposal, SamplingParams, SparseProbs
from specserve.core.verify import DRAFT_STREAM, logits_to_probs, make_generator, top_support
from specserve.models.loading import LoadedModel
from specserve.models.runner import DraftStep, ModelRunner, ModelSequence
from specserve.models.sequence import check_token_ids
from specserve.models.slot_cache import SlotCacheConfig
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS
from specserve.worker.sessions import SessionNotFoundError, SessionStore


@dataclass(frozen=True, slots=True)
class ProposeCall:
    session_id: str
    num_kept: int
    new_token_ids: list[int]
    k: int
    sampling: SamplingParams
    confidence_threshold: float = 0.0
    """Stop the window after a draft token the draft gave less than this probability (0: never)."""
    target_idle: bool = False
    """The session's target waits for this proposal (see DraftServicer.propose_batch)."""


class DraftWorker:
    """The draft model; sessions keyed by id for the service, or unmanaged via open_session()."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_sessions: int = 256,
        idle_ttl_s: float = 300.0,
        slot_cache: SlotCacheConfig | None = None,
    ) -> None:
        """slot_cache: the pool and graphed steps (models/slot_cache.py); None: the default, on CUDA only."""
        self.loaded = loaded
        self.runner = ModelRunner(loaded, slot_cache or SlotCacheConfig())
        self.sessions: SessionStore[DraftSession] = SessionStore(self.runner.max_sessions(max_sessions), idle_ttl_s)

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> DraftSession:
        return DraftSession(self.runner, prompt_token_ids, seed)

    def prefill(self, session_id: str, prompt_token_ids: list[int], seed: int | None = None) -> None:
        session = self.open_session(prompt_token_ids, seed)
        session.prefill()
        self.sessions.put(session_id, session)

    def propose(
        self, session_id: str, num_kept: int, new_token_ids: list[int], k: int, sampling: SamplingParams
    ) -> Proposal:
        """Commit the previous round's outcome, then propose k tokens: one call per round."""
        result = self.propose_batch([ProposeCall(session_id, num_kept, new_token_ids, k, sampling)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def propose_batch(self, calls: list[ProposeCall]) -> list[Proposal | Exception]:
        """Propose for many sessions at once: each draft step is one pass over every session still drafting."""
        results: list[Proposal | Exception] = [ValueError("not run")] * len(calls)
        active: list[tuple[int, DraftSession, ProposeCall, int]] = []  # (index, session, call, start)
        for i, call in enumerate(calls):
            try:
                if any(c.session_id == call.session_id for _, _, c, _ in active):
                    raise ValueError(f"session {call.session_id!r} is already drafting")
                session = self._checked(call)
            except (ValueError, SessionNotFoundError) as error:
                results[i] = error
                continue
            session.commit(call.num_kept, call.new_token_ids)
            session.sequence = self.runner.make_room(session.sequence, call.k)
            call = replace(call, k=session.model_k(call.k, call.sampling))  # a hybrid may draft by lookup
            active.append((i, session, call, len(session.sequence.token_ids)))
        drafting = [(s, c, start) for _, s, c, start in active if c.k > 0]
        while drafting:
            step = self.runner.step([s.sequence for s, _, _ in drafting])
            drafting = [  # choose() first: every session takes its token, then those still drafting go on
                (s, c, start)
                for row, (s, c, start) in enumerate(drafting)
                if s.choose(step, row, c.sampling) >= c.confidence_threshold and len(s.sequence.token_ids) - start < c.k
            ]
        for i, session, _, start in active:
            results[i] = session.take_proposal(start)
        return results

    def _checked(self, call: ProposeCall) -> DraftSession:
        session = self.sessions.get(call.session_id)
        check_token_ids(call.new_token_ids, self.loaded, "new_token_ids")
        num_tokens = len(session.sequence.token_ids)
        if not 0 <= call.k <= MAX_NUM_SPECULATIVE_TOKENS:  # each draft step holds the model thread
            raise ValueError(f"k must be in [0, {MAX_NUM_SPECULATIVE_TOKENS}], got {call.k}")
        if not 0 <= call.num_kept <= num_tokens:
            raise ValueError(f"num_kept must be in [0, {num_tokens}], got {call.num_kept}")
        if len(call.new_token_ids) + call.num_kept + call.k > self.loaded.max_context:
            raise ValueError(f"the draft's context holds {self.loaded.max_context} tokens")
        if call.k > 0 and not call.new_token_ids and call.num_kept <= session.sequence.num_cached:
            raise ValueError(  # every kept token is already fed: no logits to draft from
                f"nothing to draft from: num_kept {call.num_kept} keeps only tokens already seen and "
                "new_token_ids is empty; send the round's new token"
            )
        return session

    def release(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id)
        if session is not None:
            self.runner.release(session.sequence)
        return session is not None


class DraftSession:
    """Implements core.Drafter for one request."""

    def __init__(self, runner: ModelRunner, prompt_token_ids: list[int], seed: int | None) -> None:
        self.runner = runner
        self.sequence: ModelSequence = runner.new_sequence(prompt_token_ids)
        self.generator = make_generator(seed, DRAFT_STREAM)
        self.vocab_size = runner.loaded.vocab_size
        self._support_rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # (token ids, probs) per draft
        self.confidence_threshold = 0.0  # for propose(); the service passes one per call instead

    def prefill(self, max_tokens: int | None = None, num_left: int = 1) -> bool:
        """Cache all prompt tokens but the last `num_left`, which the first propose() feeds; True once done."""
        return self.sequence.prefill(max_tokens, num_left)

    def propose(self, k: int, sampling: SamplingParams) -> Proposal:
        self.sequence = self.runner.make_room(self.sequence, k)
        start = len(self.sequence.token_ids)
        for _ in range(self.model_k(k, sampling)):  # feeds the accepted tokens first, then each proposal
            if self.step(self.sequence.feed(1)[-1], sampling) < self.confidence_threshold:
                break
        return self.take_proposal(start)

    def choose(self, step: DraftStep, row: int, sampling: SamplingParams) -> float:
        """Draft one token from row `row` of a draft step over many sessions, as step() does; a greedy
        choice the step already made on the device is taken as it is."""
        greedy = step.greedy[row]
        if sampling.greedy and greedy is not None:
            self.sequence.token_ids.append(greedy[0])
            return greedy[1]
        return self.step(step.logits(row), sampling)

    def step(self, logits: torch.Tensor, sampling: SamplingParams) -> float:
        """Draft one token from logits [padded vocab] at the end of the sequence; returns the probability the
        draft gave it. Stopping a window on a low one keeps the output exact: the stop depends on draft-side
        randomness only, and the target checks each drafted token as before. Padding rows are cut off (as
        if masked to -inf): the draft never proposes one, and its distribution covers the target's ids."""
        logits = logits[: self.vocab_size]
        if sampling.greedy:
            logits = logits.float()  # first: argmax over float32 is twice as fast as over bfloat16 (CPU)
            token_id = int(logits.argmax())
            confidence = float(torch.exp(logits[token_id] - torch.logsumexp(logits, dim=-1)))
        else:
            support_ids, support_probs = top_support(logits_to_probs(logits[None], sampling)[0])
            self._support_rows.append((support_ids, support_probs))
            index = int(torch.multinomial(support_probs, 1, generator=self.generator))
            token_id, confidence = int(support_ids[index]), float(support_probs[index])
        self.sequence.token_ids.append(token_id)
        return confidence

    def model_k(self, k: int, sampling: SamplingParams) -> int:
        """How many of this round's k drafts the model makes (all of them; see HybridSession)."""
        return k

    def take_proposal(self, start: int) -> Proposal:
        """The tokens drafted since `start`, with their distributions when sampling."""
        rows, self._support_rows = self._support_rows, []
        probs = SparseProbs(tuple(ids for ids, _ in rows), tuple(p for _, p in rows)) if rows else None
        return Proposal(self.sequence.token_ids[start:], probs, "model")

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        self.sequence.truncate(num_kept)
        self.sequence.token_ids.extend(new_token_ids)
