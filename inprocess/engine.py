"""In-process speculative generation: a draft worker and a target worker in this process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from draft_service.hybrid import HybridWorker
from draft_service.lookup import LookupWorker
from draft_service.worker import DraftWorker
from specserve.config import EngineConfig, GenerationRequest
from specserve.core.loop import GenerationResult, SpeculativeDecoder
from specserve.core.stats import SpeculationStats
from specserve.models.draft_names import parse_draft_name
from specserve.models.loading import LoadedModel, load_model
from specserve.models.tokenizers import TokenizerSpec, check_compatible
from specserve.prompts import resolve_k, stop_conditions, tokenize_request
from target_service.worker import TargetWorker


@dataclass(frozen=True, slots=True)
class StreamChunk:
    token_ids: list[int]  # emitted by this round
    text: str  # text that became final with this chunk
    result: GenerationResult  # the request so far; final after the last chunk


class SpeculativeEngine:
    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None,
        num_speculative_tokens: int = 4,
        draft_confidence_threshold: float = 0.0,
        lookup: bool = False,
    ) -> None:
        """`draft_confidence_threshold`: the draft ends a window after a token it gave less probability;
        `lookup`: prompt lookup drafts too (draft_service/lookup.py): alone without a draft model, else the
        hybrid of the two (draft_service/hybrid.py)."""
        if draft is not None:  # refuse before any speculation: mismatched vocabularies fail silently
            if draft.max_context < target.max_context:
                raise ValueError(
                    f"the draft's context ({draft.max_context} tokens) is shorter than the target's "
                    f"({target.max_context}); the draft could not follow long requests"
                )
            check_compatible(
                TokenizerSpec.of(draft.tokenizer, draft.padded_vocab_size),
                TokenizerSpec.of(target.tokenizer, target.padded_vocab_size),
            )
        self.target, self.draft = target, draft
        self.target_worker = TargetWorker(target)
        self.draft_worker: DraftWorker | LookupWorker | None = None
        if draft is not None:
            self.draft_worker = HybridWorker(draft) if lookup else DraftWorker(draft)
        elif lookup:
            self.draft_worker = LookupWorker()
        self.num_speculative_tokens = num_speculative_tokens if self.draft_worker is not None else 0
        self.draft_confidence_threshold = draft_confidence_threshold

    @classmethod
    def from_config(cls, config: EngineConfig, home: Path | None = None) -> SpeculativeEngine:
        target = load_model(config.target, home)
        draft_name, lookup = parse_draft_name(config.draft.name) if config.draft is not None else (None, False)
        draft = load_model(replace(config.draft, name=draft_name), home) if config.draft and draft_name else None
        return cls(target, draft, config.num_speculative_tokens, lookup=lookup)

    def tokenize(self, request: GenerationRequest) -> list[int]:
        return tokenize_request(self.target.tokenizer, request, self.target.max_context, self.target.vocab_size)

    def stream(self, request: GenerationRequest) -> Iterator[StreamChunk]:
        """Yield what each round adds until the request finishes; the last chunk's result is final."""
        started = time.perf_counter()
        prompt_token_ids = self.tokenize(request)
        k = resolve_k(request, self.num_speculative_tokens, self.draft_worker is not None)
        seed = request.sampling.seed
        target_session = self.target_worker.open_session(prompt_token_ids, seed)
        draft_session = self.draft_worker.open_session(prompt_token_ids, seed) if k > 0 and self.draft_worker else None
        stats = SpeculationStats()
        target_session.prefill()
        if draft_session is not None:
            draft_session.confidence_threshold = self.draft_confidence_threshold
            draft_session.prefill()
        stats.observe_prefill(len(prompt_token_ids), time.perf_counter() - started)
        decoder = SpeculativeDecoder(
            draft_session,
            target_session,
            num_prompt_tokens=len(prompt_token_ids),
            k=k,
            sampling=request.sampling,
            stop=stop_conditions(request, self.target.eos_token_ids),
            max_context=self.target.max_context,
            decode=self.decode,
            stats=stats,
            started_at=started,
        )
        for emitted in decoder.rounds():
            yield StreamChunk(emitted, decoder.text_delta(), decoder.result)
        yield StreamChunk([], decoder.text_delta(), decoder.result)  # the rest of the text, and the final stats

    def generate(self, request: GenerationRequest) -> GenerationResult:
        *_, last = self.stream(request)
        return last.result

    def decode(self, token_ids: list[int] | tuple[int, ...]) -> str:
        return self.target.tokenizer.decode(list(token_ids), skip_special_tokens=False)
