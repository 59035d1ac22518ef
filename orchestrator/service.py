"""The orchestrator's state: its clients of the draft and target services, the tokenizer, defaults."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from orchestrator.pipeline import RemoteRequest, RequestPlan
from orchestrator.remote import DraftClient, ModelInfo, TargetClient
from specserve.config import GenerationRequest
from specserve.models.tokenizers import TokenizerMismatchError
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS, resolve_k, stop_conditions, tokenize_request


@dataclass(frozen=True, slots=True)
class OrchestratorConfig:
    target_address: str
    draft_address: str | None = None
    """None serves target-only."""
    num_speculative_tokens: int = 4
    """k when a request does not say."""
    pipelined: bool = True
    """Pre-draft the next window while the target verifies this one."""
    host: str = "127.0.0.1"
    port: int = 50051

    def __post_init__(self) -> None:
        if not 0 <= self.num_speculative_tokens <= MAX_NUM_SPECULATIVE_TOKENS:
            k, limit = self.num_speculative_tokens, MAX_NUM_SPECULATIVE_TOKENS
            raise ValueError(f"num_speculative_tokens must be in [0, {limit}], got {k}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")


class Orchestrator:
    def __init__(
        self,
        config: OrchestratorConfig,
        tokenizer: PreTrainedTokenizerBase,
        target: TargetClient,
        target_info: ModelInfo,
        draft: DraftClient | None = None,
        draft_info: ModelInfo | None = None,
    ) -> None:
        if draft_info is not None:  # refuse at start-up: mismatched vocabularies fail silently
            if draft_info.tokenizer_fingerprint != target_info.tokenizer_fingerprint:
                draft_fp, target_fp = draft_info.tokenizer_fingerprint[:12], target_info.tokenizer_fingerprint[:12]
                raise TokenizerMismatchError(
                    f"draft {draft_info.model!r} and target {target_info.model!r} have different tokenizers "
                    f"(fingerprints {draft_fp} vs {target_fp}); refusing to speculate across them"
                )
            if draft_info.max_context < target_info.max_context:
                raise ValueError(
                    f"the draft's context ({draft_info.max_context}) is shorter than the target's "
                    f"({target_info.max_context})"
                )
        self.config, self.tokenizer = config, tokenizer
        self.target, self.target_info = target, target_info
        self.draft, self.draft_info = draft, draft_info

    @property
    def default_k(self) -> int:
        return self.config.num_speculative_tokens if self.draft is not None else 0

    def start(self, request: GenerationRequest, pipelined: bool | None = None) -> RemoteRequest:
        """Validate and plan a request (raises ValueError on bad input); iterate .stream() to run it."""
        info = self.target_info
        prompt_token_ids = tokenize_request(self.tokenizer, request, info.max_context, info.vocab_size)
        room = info.max_context - len(prompt_token_ids)
        if request.max_tokens > room:  # the served API refuses up front, as OpenAI's does
            raise ValueError(
                f"max_tokens {request.max_tokens} does not fit: the prompt has {len(prompt_token_ids)} tokens "
                f"and the context holds {info.max_context}, leaving {room}"
            )
        plan = RequestPlan(
            prompt_token_ids=prompt_token_ids,
            k=resolve_k(request, self.default_k, self.draft is not None),
            sampling=request.sampling,
            stop=stop_conditions(request, info.eos_token_ids),
            max_context=info.max_context,
            vocab_size=info.vocab_size,
            pipelined=self.config.pipelined if pipelined is None else pipelined,
        )
        return RemoteRequest(self.draft, self.target, plan, self.decode)

    def decode(self, token_ids: list[int] | tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    async def close(self) -> None:
        await self.target.close()
        if self.draft is not None:
            await self.draft.close()
