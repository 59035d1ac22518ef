"""The peer: Hugging Face transformers' assisted generation (`generate(assistant_model=...)`)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from specserve.models.loading import LoadedModel


@dataclass(frozen=True, slots=True)
class PeerResult:
    token_ids: list[int]
    seconds: float
    num_target_passes: int  # prefill included


def hf_generate(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompt_token_ids: list[int],
    max_tokens: int,
    num_assistant_tokens: int | None,
    ignore_eos: bool,
) -> PeerResult:
    """Greedy `generate`; with a draft, assisted generation with `num_assistant_tokens` (None: HF's defaults)."""
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=None if ignore_eos else sorted(target.eos_token_ids),
        pad_token_id=target.tokenizer.pad_token_id or 0,
    )
    kwargs = {}
    if draft is not None:
        assistant = draft.model
        assistant.generation_config = copy.deepcopy(assistant.generation_config)
        if num_assistant_tokens is None:  # HF's defaults: 20 tokens, stop a window below confidence 0.4
            assistant.generation_config.num_assistant_tokens = 20
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.generation_config.assistant_confidence_threshold = 0.4
        else:
            assistant.generation_config.num_assistant_tokens = num_assistant_tokens
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
    passes = 0

    def count(*_: object) -> None:
        nonlocal passes
        passes += 1

    hook = target.model.register_forward_hook(count)
    try:
        input_ids = torch.tensor([prompt_token_ids], device=target.device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **kwargs
            )
        seconds = time.perf_counter() - started
    finally:
        hook.remove()
    return PeerResult(out[0, len(prompt_token_ids) :].tolist(), seconds, passes)
