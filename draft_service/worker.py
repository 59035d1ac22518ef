"""DraftWorker: the draft model and its per-request sessions (KV caches). No transport here."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specserve.core.types import Proposal, SamplingParams, SparseProbs
from specserve.core.verify import DRAFT_STREAM, logits_to_probs, make_generator, top_support
from specserve.models.batching import feed_batch
from specserve.models.llama_cpp import LlamaCppSequence
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence, check_prompt, check_token_ids, new_sequence
from specserve.models.slot_cache import SlotCacheConfig, SlotSequence, in_a_slot, slot_pool
from specserve.models.step_graphs import StepGraphs
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
        self.loaded = loaded
        slot_cache = slot_cache or SlotCacheConfig()
        self.sessions: SessionStore[DraftSession] = SessionStore(max_sessions, idle_ttl_s)
        self.pool = slot_pool(loaded, slot_cache)
        self.steps: StepGraphs | None = None
        if self.pool is not None:
            self.steps = StepGraphs(loaded.model, self.pool, slot_cache.cuda_graphs, loaded.vocab_size)

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> DraftSession:
        check_prompt(prompt_token_ids, self.loaded)
        session = self.new_session(prompt_token_ids, seed)
        if (in_slot := in_a_slot(self.pool, self.loaded, prompt_token_ids)) is not None:  # else a growing cache
            session.sequence = in_slot
        return session

    def new_session(self, prompt_token_ids: list[int], seed: int | None) -> DraftSession:
        return DraftSession(self.loaded, prompt_token_ids, seed)

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
            session.make_room(call.k)
            call = replace(call, k=session.model_k(call.k, call.sampling))  # a hybrid may draft by lookup
            active.append((i, session, call, len(session.sequence.token_ids)))
        drafting = [(s, c, start) for _, s, c, start in active if c.k > 0]
        while drafting:
            in_slots = [d for d in drafting if isinstance(d[0].sequence, SlotSequence)]
            growing = [d for d in drafting if not isinstance(d[0].sequence, SlotSequence)]
            confident = self._step_in_slots(in_slots) + self._step_growing(growing)
            drafting = [
                (s, c, start)
                for (s, c, start), ok in zip(in_slots + growing, confident)
                if ok and len(s.sequence.token_ids) - start < c.k
            ]
        for i, session, _, start in active:
            results[i] = session.take_proposal(start)
        return results

    def _step_in_slots(self, drafting: list[tuple[DraftSession, ProposeCall, int]]) -> list[bool]:
        """One draft token for each session, by one (graphed) step over the pool; whether each stays confident."""
        if not drafting:
            return []
        assert self.steps is not None
        out = self.steps.step([s.sequence for s, _, _ in drafting])  # type: ignore[misc]
        confident = []
        for row, (session, call, _) in enumerate(drafting):
            if call.sampling.greedy:
                session.sequence.token_ids.append(out.greedy_ids[row])
                confidence = out.greedy_probs[row]
            else:
                confidence = session.step(out.logits[row], call.sampling)
            confident.append(confidence >= call.confidence_threshold)
        return confident

    def _step_growing(self, drafting: list[tuple[DraftSession, ProposeCall, int]]) -> list[bool]:
        """The same over sessions with growing caches: one batched pass, tokens chosen per session."""
        if not drafting:
            return []
        logits = feed_batch([s.sequence for s, _, _ in drafting], [1] * len(drafting))  # type: ignore[misc]
        greedy = [row for row, (_, call, _) in enumerate(drafting) if call.sampling.greedy]
        if len(greedy) == 1:  # a lone row as DraftSession.step chooses it: fewer ops than the batched way
            greedy = []
        chosen = dict(zip(greedy, zip(*greedy_choice([logits[row][-1] for row in greedy], self.loaded.vocab_size))))
        confident = []
        for row, (session, call, _) in enumerate(drafting):
            if row in chosen:  # as DraftSession.step would, for all greedy rows at once
                token_id, confidence = chosen[row]
                session.sequence.token_ids.append(token_id)
            else:  # row[-1]: [vocab]
                confidence = session.step(logits[row][-1], call.sampling)
            confident.append(confidence >= call.confidence_threshold)
        return confident

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
        if session is not None and isinstance(session.sequence, (SlotSequence, LlamaCppSequence)):
            session.sequence.release()  # at once: a dropped session frees its slot only when collected
        return session is not None


def greedy_choice(rows: list[torch.Tensor], vocab_size: int) -> tuple[list[int], list[float]]:
    """rows: [padded vocab] logits each. The argmax of each row over the tokenizer's ids and the probability
    the draft gave it, as DraftSession.step chooses them, in a few tensor ops for all rows instead of a few
    per row (each op's dispatch, and on a shared CPU its OpenMP team, cost more than the arithmetic)."""
    if not rows:
        return [], []
    logits = torch.stack(rows)[:, :vocab_size].float()  # [rows, vocab]
    token_ids = logits.argmax(dim=-1)  # [rows]
    confidences = torch.exp(logits.gather(-1, token_ids[:, None])[:, 0] - torch.logsumexp(logits, dim=-1))
    return token_ids.tolist(), confidences.tolist()


class DraftSession:
    """Implements core.Drafter for one request."""

    def __init__(self, loaded: LoadedModel, prompt_token_ids: list[int], seed: int | None) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.sequence: CachedSequence | SlotSequence | LlamaCppSequence = new_sequence(loaded, prompt_token_ids)
        self.generator = make_generator(seed, DRAFT_STREAM)
        self.vocab_size = loaded.vocab_size
        self._support_rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # (token ids, probs) per draft
        self.confidence_threshold = 0.0  # for propose(); the service passes one per call instead

    def prefill(self, max_tokens: int | None = None, num_left: int = 1) -> bool:
        """Cache all prompt tokens but the last `num_left`, which the first propose() feeds; True once done."""
        return self.sequence.prefill(max_tokens, num_left)

    def propose(self, k: int, sampling: SamplingParams) -> Proposal:
        start = len(self.sequence.token_ids)
        for _ in range(self.model_k(k, sampling)):  # feeds the accepted tokens first, then each proposal
            if self.step(self.sequence.feed(1)[-1], sampling) < self.confidence_threshold:
                break
        return self.take_proposal(start)

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

    def make_room(self, k: int) -> None:
        """A sequence in a pool slot that k more tokens would overflow moves to a growing cache."""
        if isinstance(self.sequence, SlotSequence) and not self.sequence.fits(len(self.sequence.token_ids) + k):
            self.sequence = self.sequence.to_growing()

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        self.sequence.truncate(num_kept)
        self.sequence.token_ids.extend(new_token_ids)
