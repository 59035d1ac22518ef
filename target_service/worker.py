"""TargetWorker: the target model and its sessions; verification runs here, next to the logits."""

from __future__ import annotations

from specserve.core.types import Proposal, SamplingParams, Verdict
from specserve.core.verify import TARGET_STREAM, greedy_verify, logits_to_probs, make_generator, rejection_sample
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence, check_token_ids
from specserve.sessions import SessionStore


class TargetWorker:
    """The target model; sessions keyed by id for the service, or unmanaged via open_session()."""

    def __init__(self, loaded: LoadedModel, max_sessions: int = 256, idle_ttl_s: float = 300.0) -> None:
        self.loaded = loaded
        self.sessions: SessionStore[TargetSession] = SessionStore(max_sessions, idle_ttl_s)

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> TargetSession:
        check_token_ids(prompt_token_ids, self.loaded, "prompt_token_ids")
        return TargetSession(self.loaded, prompt_token_ids, seed)

    def prefill(self, session_id: str, prompt_token_ids: list[int], seed: int | None = None) -> None:
        session = self.open_session(prompt_token_ids, seed)
        session.prefill()
        self.sessions.put(session_id, session)

    def verify(self, session_id: str, proposal: Proposal, sampling: SamplingParams) -> Verdict:
        session = self.sessions.get(session_id)
        check_token_ids(proposal.token_ids, self.loaded, "draft_token_ids")
        room = self.loaded.max_context - len(session.sequence.token_ids)
        if len(proposal.token_ids) >= room:
            raise ValueError(f"{len(proposal.token_ids)} drafts do not fit: {room} positions left in the context")
        return session.verify(proposal, sampling)

    def release(self, session_id: str) -> bool:
        return self.sessions.pop(session_id) is not None


class TargetSession:
    """Implements core.Verifier for one request. The last context token is always pending."""

    def __init__(self, loaded: LoadedModel, prompt_token_ids: list[int], seed: int | None) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.sequence = CachedSequence(loaded.model, prompt_token_ids)
        self.generator = make_generator(seed, TARGET_STREAM)

    def prefill(self) -> None:
        if self.sequence.num_pending > 1:
            self.sequence.feed(1, upto=len(self.sequence.token_ids) - 1)

    def verify(self, proposal: Proposal, sampling: SamplingParams) -> Verdict:
        sequence = self.sequence
        k = len(proposal.token_ids)
        num_context = len(sequence.token_ids)
        sequence.token_ids.extend(proposal.token_ids)
        target_logits = sequence.feed(k + 1)  # [k + 1, vocab]: the last context token + k proposals, one pass
        if sampling.greedy:
            verdict = greedy_verify(proposal.token_ids, target_logits)
        else:
            if k and proposal.probs is None:
                raise ValueError("sampled verification needs the draft probabilities")
            target_probs = logits_to_probs(target_logits, sampling)  # [k + 1, vocab]
            draft_probs = proposal.probs if k else target_probs[:0]  # [k, vocab]
            verdict = rejection_sample(proposal.token_ids, draft_probs, target_probs, self.generator)
        sequence.truncate(num_context + verdict.num_accepted)
        sequence.token_ids.append(verdict.token_ids[-1])
        return verdict
