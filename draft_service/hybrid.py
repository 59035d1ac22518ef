"""The hybrid drafter (`--draft MODEL+ngram`): per round, prompt lookup or the draft model, in one service.
The model's KV cache stays consistent across lookup rounds: their tokens join its sequence as pending
tokens, which its next step feeds first."""

from __future__ import annotations

from dataclasses import dataclass, replace

from draft_service.lookup import LOOKUP_SOURCE, MODEL_SOURCE, LookupConfig, LookupSession
from draft_service.worker import DraftSession, DraftWorker
from specserve.core.types import Proposal, SamplingParams
from specserve.models.loading import LoadedModel
from specserve.models.runner import ModelRunner
from specserve.models.slot_cache import SlotCacheConfig


@dataclass(frozen=True, slots=True)
class HybridConfig:
    """When lookup drafts a round instead of the model (HybridSession.model_k)."""

    lookup: LookupConfig = LookupConfig()
    min_match: int = 3
    """Lookup drafts only after a suffix match of at least this many tokens (shorter ones are often chance)."""
    min_relative_acceptance: float = 0.8
    """... and while its acceptance in this session is at least this fraction of the model's: a lookup
    round costs the target the same verification and the draft nothing, so it may be somewhat worse."""
    memory: float = 0.9
    """Each judged window first scales both sources' counts by this: acceptance is that of recent windows,
    and a source left for a while drifts back to its untried estimate and is tried again."""

    def __post_init__(self) -> None:
        if self.min_match < self.lookup.min_ngram:
            raise ValueError(f"min_match must be >= lookup.min_ngram {self.lookup.min_ngram}, got {self.min_match}")
        if self.min_relative_acceptance < 0:
            raise ValueError(f"min_relative_acceptance must be >= 0, got {self.min_relative_acceptance}")
        if not 0 < self.memory <= 1:
            raise ValueError(f"memory must be in (0, 1], got {self.memory}")


class HybridSession(DraftSession):
    """A model draft session with a lookup index over the same tokens.

    The rule, per round: lookup drafts when the longest suffix match is at least `min_match` tokens long
    and lookup's acceptance rate in this session is at least `min_relative_acceptance` times the model's;
    otherwise the model drafts. Each source's rate is (accepted + 1) / (proposed + 1) over its recent
    judged windows (counts fade by `memory` per judged window): 1 untried, so lookup is tried on its first
    good match, and tried again some rounds after it did badly. A window is judged when a commit carries
    new tokens or cuts the context (a pre-draft's commit, which keeps everything and adds nothing, only
    assumes). The choice depends only on what is already committed, never on this round's verification,
    so sampled output stays exact. The adaptive k of the orchestrator sees the cheaper lookup rounds in its
    round times."""

    def __init__(self, runner: ModelRunner, prompt_token_ids: list[int], seed: int | None, config: HybridConfig):
        super().__init__(runner, prompt_token_ids, seed)
        self.config = config
        self.lookup = LookupSession(prompt_token_ids, config.lookup)
        self.num_proposed = {MODEL_SOURCE: 0.0, LOOKUP_SOURCE: 0.0}  # recent windows' drafts, fading
        self.num_accepted = {MODEL_SOURCE: 0.0, LOOKUP_SOURCE: 0.0}
        self._unjudged: list[tuple[int, int, str]] = []  # (start, length, source) of windows not yet judged
        self._lookup_round: tuple[list[int], SamplingParams] | None = None

    def acceptance(self, source: str) -> float:
        return (self.num_accepted[source] + 1) / (self.num_proposed[source] + 1)

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        if new_token_ids or num_kept < len(self.sequence.token_ids):
            for start, length, source in self._unjudged:
                if start <= num_kept:  # else never verified (a pre-draft after a rejection)
                    for counts in (self.num_proposed, self.num_accepted):
                        for name in counts:
                            counts[name] *= self.config.memory
                    self.num_proposed[source] += length
                    self.num_accepted[source] += min(length, num_kept - start)
            self._unjudged.clear()
        super().commit(num_kept, new_token_ids)
        self.lookup.commit(num_kept, new_token_ids)

    def model_k(self, k: int, sampling: SamplingParams) -> int:
        """0 when lookup drafts this round (its window is taken in take_proposal), else k."""
        self._lookup_round = None
        if k == 0:
            return 0
        n, token_ids = self.lookup.index.match(k)
        ratio = self.config.min_relative_acceptance
        if (
            token_ids
            and n >= self.config.min_match
            and (self.acceptance(LOOKUP_SOURCE) >= ratio * self.acceptance(MODEL_SOURCE))
        ):
            self._lookup_round = (token_ids, sampling)
            return 0
        return k

    def take_proposal(self, start: int) -> Proposal:
        if self._lookup_round is not None:
            token_ids, sampling = self._lookup_round
            self._lookup_round = None
            self.sequence.token_ids.extend(token_ids)  # pending for the model: its next step feeds them
            proposal = self.lookup.take(token_ids, sampling)
        else:
            proposal = replace(super().take_proposal(start), source=MODEL_SOURCE)
            self.lookup.index.extend(proposal.token_ids)
        assert len(self.lookup.index) == len(self.sequence.token_ids), "lookup and model contexts diverged"
        if proposal.token_ids:
            self._unjudged.append((start, len(proposal.token_ids), proposal.source))
        return proposal


class HybridWorker(DraftWorker):
    """DraftWorker whose sessions are HybridSessions (the batching, slots and checks are the model's)."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_sessions: int = 256,
        idle_ttl_s: float = 300.0,
        slot_cache: SlotCacheConfig | None = None,
        config: HybridConfig = HybridConfig(),
    ) -> None:
        super().__init__(loaded, max_sessions, idle_ttl_s, slot_cache)
        self.config = config

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> DraftSession:
        return HybridSession(self.runner, prompt_token_ids, seed, self.config)
