"""DraftWorker: the draft model and its per-request sessions (KV caches). No transport here."""

from __future__ import annotations

import torch

from specserve.core.types import Proposal, SamplingParams
from specserve.core.verify import DRAFT_STREAM, logits_to_probs, make_generator, sample
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence


class DraftWorker:
    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> DraftSession:
        return DraftSession(self.loaded, prompt_token_ids, seed)


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
                probs = logits_to_probs(logits[None], sampling)[0]
                probs_rows.append(probs)
                token_id = sample(probs, self.generator)
            sequence.token_ids.append(token_id)
        proposed = sequence.token_ids[start:]
        return Proposal(proposed, torch.stack(probs_rows) if probs_rows else None)

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        self.sequence.truncate(num_kept)
        self.sequence.token_ids.extend(new_token_ids)
