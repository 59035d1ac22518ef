"""From a GenerationRequest to what the loop needs: prompt token ids, k, stop conditions.
Shared by the in-process engine and the orchestrator, so both read a request the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specserve.config import GenerationRequest
from specserve.core.loop import StopConditions

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_NUM_SPECULATIVE_TOKENS = 32


def tokenize_request(
    tokenizer: PreTrainedTokenizerBase, request: GenerationRequest, max_context: int, vocab_size: int
) -> list[int]:
    if request.prompt_token_ids is not None:
        token_ids = list(request.prompt_token_ids)
    elif request.messages is not None:
        messages = [{"role": role, "content": content} for role, content in request.messages]
        token_ids = list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    else:
        token_ids = tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
    # each message starts with the request field at fault: the HTTP API names it as OpenAI's "param"
    field = "messages have" if request.messages is not None else "prompt has"
    if not token_ids:
        raise ValueError(f"{field} no tokens after tokenization")
    if len(token_ids) >= max_context:
        raise ValueError(f"{field} {len(token_ids)} tokens; the target's context holds {max_context}")
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got {bad[:5]}")
    return token_ids


def resolve_k(request: GenerationRequest, default: int, has_draft: bool) -> int:
    k = default if request.num_speculative_tokens is None else request.num_speculative_tokens
    if not 0 <= k <= MAX_NUM_SPECULATIVE_TOKENS:
        raise ValueError(f"num_speculative_tokens must be in [0, {MAX_NUM_SPECULATIVE_TOKENS}], got {k}")
    if k > 0 and not has_draft:
        raise ValueError("this server has no draft model; num_speculative_tokens must be 0")
    return k


def stop_conditions(request: GenerationRequest, eos_token_ids: frozenset[int]) -> StopConditions:
    return StopConditions(request.max_tokens, frozenset() if request.ignore_eos else eos_token_ids, request.stop)
