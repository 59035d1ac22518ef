"""TargetWorker: the target model and its sessions; verification runs here, next to the logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.core.types import Proposal, SamplingParams, Verdict
from specserve.core.verify import TARGET_STREAM, greedy_verify, logits_to_probs, make_generator, rejection_sample
from specserve.models.loading import LoadedModel
from specserve.models.runner import ModelRunner, ModelSequence
from specserve.models.sequence import check_token_ids
from specserve.models.slot_cache import SlotCacheConfig
from specserve.worker.sessions import SessionNotFoundError, SessionStore


@dataclass(frozen=True, slots=True)
class VerifyCall:
    session_id: str
    proposal: Proposal
    sampling: SamplingParams


class TargetWorker:
    """The target model; sessions keyed by id for the service, or unmanaged via open_session()."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_sessions: int = 256,
        idle_ttl_s: float = 300.0,
        slot_cache: SlotCacheConfig | None = None,
    ) -> None:
        """slot_cache: sessions' KV caches in a preallocated pool (models/slot_cache.py), fed one session per
        pass by the same lean pass as a growing cache, so outputs are unchanged; off unless given."""
        self.loaded = loaded
        self.runner = ModelRunner(loaded, slot_cache)
        self.sessions: SessionStore[TargetSession] = SessionStore(self.runner.max_sessions(max_sessions), idle_ttl_s)

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> TargetSession:
        return TargetSession(self.runner, prompt_token_ids, seed)

    def prefill(self, session_id: str, prompt_token_ids: list[int], seed: int | None = None) -> None:
        session = self.open_session(prompt_token_ids, seed)
        session.prefill()
        self.sessions.put(session_id, session)

    def verify(self, session_id: str, proposal: Proposal, sampling: SamplingParams) -> Verdict:
        result = self.verify_batch([VerifyCall(session_id, proposal, sampling)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def verify_batch(self, calls: list[VerifyCall]) -> list[Verdict | Exception]:
        """Verify the windows of many sessions in one target pass; a bad call fails alone."""
        results: list[Verdict | Exception] = [ValueError("not run")] * len(calls)
        ready: list[tuple[int, TargetSession, VerifyCall]] = []
        for i, call in enumerate(calls):
            try:
                if any(c.session_id == call.session_id for _, _, c in ready):
                    raise ValueError(f"session {call.session_id!r} is already being verified")
                ready.append((i, self._checked(call), call))
            except (ValueError, SessionNotFoundError) as error:
                results[i] = error
        if ready:
            num_contexts = [session.begin(call.proposal) for _, session, call in ready]
            num_logits = [len(call.proposal.token_ids) + 1 for _, _, call in ready]
            logits = self.runner.feed([session.sequence for _, session, _ in ready], num_logits)
            for (i, session, call), target_logits, num_context in zip(ready, logits, num_contexts):
                results[i] = session.finish(call.proposal, call.sampling, target_logits, num_context)
        return results

    def check_run(self, call: VerifyCall, num_tokens: int) -> int:
        """The tokens a call decodes: 1, or `num_tokens` for a run (target-only, within the context)."""
        if num_tokens <= 1:
            if num_tokens < 0:
                raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
            return 1
        if call.proposal.token_ids:
            raise ValueError("a run (num_tokens > 1) decodes target-only: it takes no draft tokens")
        room = self.loaded.max_context - len(self.sessions.get(call.session_id).sequence.token_ids)
        if num_tokens > room:
            raise ValueError(f"a run of {num_tokens} tokens does not fit: {room} positions left in the context")
        return num_tokens

    def _checked(self, call: VerifyCall) -> TargetSession:
        session = self.sessions.get(call.session_id)
        proposal = call.proposal
        check_token_ids(proposal.token_ids, self.loaded, "draft_token_ids")
        room = self.loaded.max_context - len(session.sequence.token_ids)
        if len(proposal.token_ids) >= room:
            raise ValueError(f"{len(proposal.token_ids)} drafts do not fit: {room} positions left in the context")
        if not call.sampling.greedy and proposal.token_ids and proposal.probs is None:
            raise ValueError("sampled verification needs the draft probabilities")
        return session

    def release(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id)
        if session is not None:
            self.runner.release(session.sequence)
        return session is not None


class TargetSession:
    """Implements core.Verifier for one request. The last context token is always pending."""

    def __init__(self, runner: ModelRunner, prompt_token_ids: list[int], seed: int | None) -> None:
        self.runner = runner
        self.sequence: ModelSequence = runner.new_sequence(prompt_token_ids)
        self.generator = make_generator(seed, TARGET_STREAM)
        self.vocab_size = runner.loaded.vocab_size

    def prefill(self, max_tokens: int | None = None, num_left: int = 1) -> bool:
        return self.sequence.prefill(max_tokens, num_left)

    def verify(self, proposal: Proposal, sampling: SamplingParams) -> Verdict:
        num_context = self.begin(proposal)
        target_logits = self.sequence.feed(len(proposal.token_ids) + 1)
        return self.finish(proposal, sampling, target_logits, num_context)

    def begin(self, proposal: Proposal) -> int:
        """Queue the proposals behind the pending last context token, with room for them (a slot they would
        overflow moves to a growing cache); returns the context length."""
        self.sequence = self.runner.make_room(self.sequence, len(proposal.token_ids) + 1)
        num_context = len(self.sequence.token_ids)
        self.sequence.token_ids.extend(proposal.token_ids)
        return num_context

    def finish(
        self, proposal: Proposal, sampling: SamplingParams, target_logits: torch.Tensor, num_context: int
    ) -> Verdict:
        """target_logits: [k + 1, padded vocab] over the last context token and the k proposals, from one pass.
        Only the tokenizer's ids compete: padding rows are cut off, as if masked to -inf, so neither argmax nor
        sampling can choose one, and the rejection rule compares the draft's distribution over the same ids."""
        k = len(proposal.token_ids)
        target_logits = target_logits[:, : self.vocab_size]  # [k + 1, vocab]
        if sampling.greedy:
            verdict = greedy_verify(proposal.token_ids, target_logits)
        else:
            if k and proposal.probs is None:
                raise ValueError("sampled verification needs the draft probabilities")
            target_probs = logits_to_probs(target_logits, sampling)  # [k + 1, vocab]
            draft_probs = proposal.probs.to_dense(target_probs.shape[-1]) if k else target_probs[:0]  # [k, vocab]
            verdict = rejection_sample(proposal.token_ids, draft_probs, target_probs, self.generator)
        self.sequence.truncate(num_context + verdict.num_accepted)
        self.sequence.token_ids.append(verdict.token_ids[-1])
        return verdict
