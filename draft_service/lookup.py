"""Prompt lookup: draft the continuation of the longest recent n-gram match in the session's own tokens.
No model, no tokenizer: a LookupWorker serves `--draft ngram`; LookupSession is also the lookup half of
the hybrid drafter (draft_service/hybrid.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draft_service.worker import ProposeCall
from specserve.core.types import Proposal, SamplingParams, SparseProbs
from specserve.models.draft_names import NGRAM
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS
from specserve.worker.sessions import SessionNotFoundError, SessionStore

LOOKUP_SOURCE, MODEL_SOURCE = "ngram", "model"  # ProposeResponse.source


@dataclass(frozen=True, slots=True)
class LookupConfig:
    """The n-gram sizes tried, longest first (vLLM's prompt_lookup_max / prompt_lookup_min)."""

    max_ngram: int = 4
    min_ngram: int = 2
    """A 1-token match proposes after any repeated token: cheap to draft, but each rejected window still
    costs the target its verification, so the default asks for two."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram {self.min_ngram}, max {self.max_ngram}")


class NgramIndex:
    """Tokens plus, per n-gram, the end of its latest occurrence that has a token after it.

    The n-grams ending at position p enter the index when token p is appended (so the current suffix
    never finds itself), each with an undo record: rolling back to N tokens undoes the records of the
    removed positions. Appending and rolling back cost O(max_ngram) per token; a lookup O(max_ngram)."""

    def __init__(self, config: LookupConfig, token_ids: list[int] | None = None) -> None:
        self.config = config
        self.token_ids: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest occurrence
        self._undo: list[list[tuple[tuple[int, ...], int | None]]] = []  # [p]: (n-gram, previous end) added at p
        self.extend(token_ids or [])

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, token_ids: list[int]) -> None:
        tokens, low, high = self.token_ids, self.config.min_ngram, self.config.max_ngram
        for token_id in token_ids:
            end = len(tokens)  # the n-grams ending here now have a continuation: token_id
            records = []
            for n in range(low, min(high, end) + 1):
                key = tuple(tokens[end - n : end])
                records.append((key, self._latest.get(key)))
                self._latest[key] = end
            self._undo.append(records)
            tokens.append(token_id)

    def truncate(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens."""
        assert 0 <= num_tokens <= len(self.token_ids)
        while len(self.token_ids) > num_tokens:
            self.token_ids.pop()
            for key, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._latest[key]
                else:
                    self._latest[key] = previous

    def match(self, k: int) -> tuple[int, list[int]]:
        """(n, up to k tokens that followed the latest earlier occurrence of the longest matching suffix
        n-gram); (0, []) when no suffix of min_ngram..max_ngram tokens occurred before."""
        tokens = self.token_ids
        for n in range(min(self.config.max_ngram, len(tokens) - 1), self.config.min_ngram - 1, -1):
            end = self._latest.get(tuple(tokens[len(tokens) - n :]))
            if end is not None:
                return n, tokens[end : end + k]
        return 0, []


class LookupSession:
    """Implements core.Drafter by prompt lookup. Its context includes its own last proposal (as a model
    draft's does), so that the orchestrator's keep-N commit works the same for both."""

    confidence_threshold = 0.0  # DraftSession's window stop; a lookup's draft is certain, so it never stops

    def __init__(self, prompt_token_ids: list[int], config: LookupConfig = LookupConfig()) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.index = NgramIndex(config, prompt_token_ids)

    def prefill(self, max_tokens: int | None = None, num_left: int = 1) -> bool:
        return True  # the index is built as tokens arrive

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        self.index.truncate(num_kept)
        self.index.extend(new_token_ids)

    def propose(self, k: int, sampling: SamplingParams) -> Proposal:
        _, token_ids = self.index.match(k)
        return self.take(token_ids, sampling)

    def take(self, token_ids: list[int], sampling: SamplingParams) -> Proposal:
        """Append `token_ids` as this round's proposal: a deterministic draft, so when sampling each row is
        one-hot (probability 1 on the token), which the rejection rule handles exactly."""
        self.index.extend(token_ids)
        return Proposal(token_ids, None if sampling.greedy or not token_ids else one_hot(token_ids), LOOKUP_SOURCE)


def one_hot(token_ids: list[int]) -> SparseProbs:
    ids = torch.tensor(token_ids, dtype=torch.long)
    return SparseProbs(tuple(ids.split(1)), tuple(torch.ones(len(token_ids), dtype=torch.float32).split(1)))


class LookupWorker:
    """The draft service's worker for `--draft ngram`: the same session API as DraftWorker, no model."""

    name = NGRAM

    def __init__(self, max_sessions: int = 256, idle_ttl_s: float = 300.0, config: LookupConfig = LookupConfig()):
        self.config = config
        self.sessions: SessionStore[LookupSession] = SessionStore(max_sessions, idle_ttl_s)

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> LookupSession:
        _check_ids(prompt_token_ids, "prompt_token_ids")
        return LookupSession(prompt_token_ids, self.config)

    def prefill(self, session_id: str, prompt_token_ids: list[int], seed: int | None = None) -> None:
        self.sessions.put(session_id, self.open_session(prompt_token_ids, seed))

    def propose(
        self, session_id: str, num_kept: int, new_token_ids: list[int], k: int, sampling: SamplingParams
    ) -> Proposal:
        result = self.propose_batch([ProposeCall(session_id, num_kept, new_token_ids, k, sampling)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def propose_batch(self, calls: list[ProposeCall]) -> list[Proposal | Exception]:
        results: list[Proposal | Exception] = []
        for call in calls:
            try:
                session = self.sessions.get(call.session_id)
                _check_ids(call.new_token_ids, "new_token_ids")
                if not 0 <= call.k <= MAX_NUM_SPECULATIVE_TOKENS:
                    raise ValueError(f"k must be in [0, {MAX_NUM_SPECULATIVE_TOKENS}], got {call.k}")
                if not 0 <= call.num_kept <= len(session.index):
                    raise ValueError(f"num_kept must be in [0, {len(session.index)}], got {call.num_kept}")
            except (ValueError, SessionNotFoundError) as error:
                results.append(error)
                continue
            session.commit(call.num_kept, call.new_token_ids)
            results.append(session.propose(call.k, call.sampling))
        return results

    def release(self, session_id: str) -> bool:
        return self.sessions.pop(session_id) is not None


def _check_ids(token_ids: list[int], field: str) -> None:
    if any(t < 0 for t in token_ids):
        raise ValueError(f"{field}: token ids must be >= 0")
