"""DraftWorker: the draft model and its per-request sessions (KV caches). No transport here."""

from __future__ import annotations

import torch

from specserve.core.types import Proposal, SamplingParams
from specserve.core.verify import DRAFT_STREAM, logits_to_probs, make_generator, sample, truncate_support
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence, check_token_ids
from specserve.sessions import SessionStore


class DraftWorker:
    """The draft model; sessions keyed by id for the service, or unmanaged via open_session()."""

    def __init__(self, loaded: LoadedModel, max_sessions: int = 256, idle_ttl_s: float = 300.0) -> None:
        self.loaded = loaded
        self.sessions: SessionStore[DraftSession] = SessionStore(max_sessions, idle_ttl_s)

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> DraftSession:
        check_token_ids(prompt_token_ids, self.loaded, "prompt_token_ids")
        return DraftSession(self.loaded, prompt_token_ids, seed)

    def prefill(self, session_id: str, prompt_token_ids: list[int], seed: int | None = None) -> None:
        session = self.open_session(prompt_token_ids, seed)
        session.prefill()
        self.sessions.put(session_id, session)

    def propose(
        self, session_id: str, num_kept: int, new_token_ids: list[int], k: int, sampling: SamplingParams
    ) -> Proposal:
        """Commit the previous round's outcome, then propose k tokens: one call per round."""
        session = self.sessions.get(session_id)
        check_token_ids(new_token_ids, self.loaded, "new_token_ids")
        if not 0 <= num_kept <= len(session.sequence.token_ids):
            raise ValueError(f"num_kept must be in [0, {len(session.sequence.token_ids)}], got {num_kept}")
        if len(new_token_ids) + num_kept + k > self.loaded.max_context:
            raise ValueError(f"the draft's context holds {self.loaded.max_context} tokens")
        session.commit(num_kept, new_token_ids)
        return session.propose(k, sampling)

    def release(self, session_id: str) -> bool:
        return self.sessions.pop(session_id) is not None


class DraftSession:
    """Implements core.Drafter for one request."""

    def __init__(self, loaded: LoadedModel, prompt_token_ids: list[int], seed: int | None) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.sequence = CachedSequence(loaded.model, prompt_token_ids)
        self.generator = make_generator(seed, DRAFT_STREAM)

    def prefill(self) -> None:
        """Cache all prompt tokens but the last, which the first propose() feeds."""
        if self.sequence.num_pending > 1:
            self.sequence.feed(1, upto=len(self.sequence.token_ids) - 1)

    def propose(self, k: int, sampling: SamplingParams) -> Proposal:
        sequence = self.sequence
        start = len(sequence.token_ids)
        probs_rows: list[torch.Tensor] = []
        for _ in range(k):
            logits = sequence.feed(1)[-1]  # [vocab]; feeds the accepted tokens first, then each proposal
            if sampling.greedy:
                token_id = int(logits.argmax())
            else:
                probs = truncate_support(logits_to_probs(logits[None], sampling))[0]
                probs_rows.append(probs)
                token_id = sample(probs, self.generator)
            sequence.token_ids.append(token_id)
        proposed = sequence.token_ids[start:]
        return Proposal(proposed, torch.stack(probs_rows) if probs_rows else None)

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        self.sequence.truncate(num_kept)
        self.sequence.token_ids.extend(new_token_ids)
