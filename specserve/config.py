"""Typed configuration of a generation request and of the in-process engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specserve.core.loop import StopConditions
from specserve.core.types import SamplingParams
from specserve.flags import NO_FLAG, flag
from specserve.models.config import ModelConfig
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specserve.security import TLSConfig

if TYPE_CHECKING:
    from specserve.models.slot_cache import SlotCacheConfig


@dataclass(frozen=True, slots=True)
class EngineConfig:
    target: ModelConfig = field(default_factory=lambda: ModelConfig(DEFAULT_TARGET))
    """The model whose output is reproduced."""
    draft: ModelConfig | None = field(default_factory=lambda: ModelConfig.for_role("draft", DEFAULT_DRAFT))
    """The proposer (int4/int8 on CPU by default: models/quantized.py); None for target-only serving."""
    num_speculative_tokens: int = 4
    """k: drafts proposed per round when a request does not say. 0 = target-only."""

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
        if self.num_speculative_tokens > 0 and self.draft is None:
            raise ValueError("num_speculative_tokens > 0 needs a draft model")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt: str | None = field(default=None, metadata=NO_FLAG)
    """Raw text, tokenized as the model's tokenizer does by default (no chat template)."""
    messages: tuple[tuple[str, str], ...] | None = None
    """(role, content) pairs, rendered with the model's chat template. Exactly one of prompt/messages."""
    prompt_token_ids: tuple[int, ...] | None = None
    """Already-tokenized prompt (used by benchmarks and the services)."""
    max_tokens: int = 128
    """Tokens to generate at most."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = field(default=(), metadata=flag(one_per_flag=True))
    """Stop strings: generation ends before the first occurrence of any (`--stop` once per string)."""
    num_speculative_tokens: int | None = None
    """Overrides the engine's k for this request; 0 = target-only."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence tokens (benchmarks use it to generate exactly max_tokens)."""

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.prompt, self.messages, self.prompt_token_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, messages or prompt_token_ids")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
        StopConditions(self.max_tokens, stop=self.stop)  # validates max_tokens and stop strings


DRAFT_ONLY_SETTINGS = ("draft_slots", "draft_slot_tokens", "prompt_lookup_max", "prompt_lookup_min")
"""The WorkerServiceConfig fields a target ignores (and `python -m target_service` has no flag for)."""


@dataclass(frozen=True, slots=True)
class WorkerServiceConfig:
    """One draft or target gRPC server: the one declaration of a worker's settings (`python -m draft_service`
    flags and a deployment role's keys derive from it)."""

    model: ModelConfig = field(metadata=NO_FLAG)
    host: str = "127.0.0.1"
    """Interface to listen on; loopback unless deliberately opened (0.0.0.0 / [::])."""
    port: int = 0
    """0 picks a free port (reported in the log and to the caller)."""
    max_sessions: int = 256
    """Sessions (KV caches) kept at once; the least recently used is evicted beyond it."""
    idle_ttl_s: float = 300.0
    """A session unused this long is evicted; its next use gets NOT_FOUND and the orchestrator prefills again."""
    max_batch_size: int = 16
    """Sessions served by one forward pass at most (continuous batching of Verify / Propose calls)."""
    tls: TLSConfig | None = field(default=None, metadata=NO_FLAG)
    """Serve over TLS; with require_client_auth and allowed_peers, only the orchestrator may call. None:
    plaintext (loopback and trusted networks only)."""
    prefill_chunk_tokens: int = 256
    """A prompt is prefilled this many tokens per pass, the other sessions' passes running in between."""
    inline_pass_ms: float = 5.0
    """A pass expected to take less (its predecessor did) runs on the RPC loop's own thread, without a
    hand-off to the model thread and back; a longer one on the model thread, the loop answering meanwhile.
    Only on a GPU or with one CPU thread (a second OpenMP team would slow every pass). 0: never."""
    draft_slots: int = 64
    """A draft on CUDA: sessions whose KV caches live in its preallocated pool, stepped by CUDA graphs
    (models/slot_cache.py); the others keep growing caches and eager steps. 0: no pool. Ignored by targets."""
    draft_slot_tokens: int = 4096
    """A draft on CUDA: context one pool slot holds (a longer session moves to a growing cache)."""
    prompt_lookup_max: int = 4
    """A prompt-lookup draft (`ngram`, `MODEL+ngram`): the longest suffix n-gram it looks up (vLLM's name)."""
    prompt_lookup_min: int = 2
    """A prompt-lookup draft: the shortest suffix n-gram it looks up. Ignored by other workers."""
    cpu_threads: int | None = None
    """Torch threads for CPU inference; None: every core of the node for a target, a quarter for a draft
    (specserve.models.loading.cpu_threads; `python -m *_service` follows OMP_NUM_THREADS where it is set)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.idle_ttl_s <= 0:
            raise ValueError(f"idle_ttl_s must be > 0, got {self.idle_ttl_s}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.inline_pass_ms < 0.0:
            raise ValueError(f"inline_pass_ms must be >= 0, got {self.inline_pass_ms}")
        if self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}")
        if self.draft_slots < 0 or self.draft_slot_tokens < 1:
            raise ValueError(f"draft_slots must be >= 0 and draft_slot_tokens >= 1, got {self.draft_slots}, "
                             f"{self.draft_slot_tokens}")  # fmt: skip
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {self.prompt_lookup_min}, "
                             f"{self.prompt_lookup_max}")  # fmt: skip
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")

    def slot_cache(self) -> SlotCacheConfig:
        """The draft's slot pool: on CUDA (as SlotCacheConfig decides) unless draft_slots is 0."""
        from specserve.models.slot_cache import SlotCacheConfig

        if self.draft_slots == 0:
            return SlotCacheConfig(enabled=False)
        return SlotCacheConfig(slots=self.draft_slots, tokens_per_slot=self.draft_slot_tokens)
