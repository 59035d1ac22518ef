"""What a bench run measures (BenchConfig) and the shape of one mode's run on one prompt: shared by the
in-process runner and the served stack."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specserve.core.stats import SpeculationStats
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET


@dataclass(frozen=True, slots=True)
class BenchConfig:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    num_prompts: int = 10
    max_tokens: int = 128
    ks: tuple[int, ...] = (2, 4, 6, 8)
    target_dtype: str = "auto"
    """The target of the speculative and peer modes."""
    baseline_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    """Target-only is run in each; speedups are against the fastest target-only mode (HF's generate() too)."""
    draft_quantization: str = "auto"
    stop_threshold: float = 0.0
    """Also run each k with the draft's early stop: a window ends after a token the draft gave less than
    this probability (HF's default schedule stops at 0.4); 0: not."""
    hf_ks: tuple[int, ...] = (4,)
    """Peer modes with a constant window; the peer also runs once with its own defaults."""
    hf: bool = True
    """Run the peer (Hugging Face assisted generation)."""
    hf_plain_target: bool = True
    """Also run the peer's target-only and default modes on a target loaded as transformers ships it, without
    specserve's prepacked weights and few-query attention (the peer's other modes get them, as they get the
    quantized draft)."""
    hf_fp32_draft: bool = True
    """Also run the peer and specserve with an unquantized float32 draft, in case it is faster."""
    in_process: bool = True
    """Run specserve's modes in this process too. Without them (with `served` or `address`), the target here
    is loaded only as transformers ships it, for the peer and the output checks: one copy of the target
    fewer, so that on a small host the peer as shipped fits beside the served stack."""
    served: bool = False
    """Also run the served stack (draft and target services in child processes, orchestrators here),
    pipelined and not, with the same models."""
    address: str | None = None
    """Also measure an already-running orchestrator at HOST:PORT (serving the same models)."""
    ignore_eos: bool = True
    """Generate exactly max_tokens in every mode, so all modes do the same work."""
    categories: tuple[str, ...] = ("code",)
    """Workloads whose prompts are measured (specserve/bench/workloads.py), up to num_prompts of each;
    chat-style ones rendered through the target's chat template."""
    extra_drafts: tuple[str, ...] = ()
    """With `served`: more draft services over the same target worker, each measured at adaptive k and at
    each k of `ks`, e.g. `ngram` (prompt lookup) or `MODEL+ngram` (the hybrid)."""
    served_variants: tuple[str, ...] | None = None
    """With `served`: which variants of the default draft's "served k=N" modes run (specserve/bench/served.py
    SERVED_MODE_SUFFIXES: pipelined, unpipelined, ...); None: all of them."""

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.num_prompts > 164:
            raise ValueError(f"num_prompts must be in 1..164 (HumanEval), got {self.num_prompts}")
        if any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be >= 1, got {self.ks}")
        if not 0.0 <= self.stop_threshold < 1.0:
            raise ValueError(f"stop_threshold must be in [0, 1), got {self.stop_threshold}")
        if not self.in_process and not (self.served or self.address):
            raise ValueError("without the in-process modes the bench needs the served stack or an address")
        if self.extra_drafts and not self.served:
            raise ValueError(f"extra_drafts {list(self.extra_drafts)} are measured on the served stack: add served")
        if not self.categories:
            raise ValueError("categories must name at least one workload")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    token_ids: list[int]


RunOutput = tuple[list[int], float, SpeculationStats | None, int]  # tokens, seconds, stats, peer target passes
Runner = Callable[[Prompt], RunOutput]
