"""What `specserve bench` measures, as typed configs its subcommands' flags derive from (no torch here: the
CLI builds its parser from this module)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specserve.bench.load import DEFAULT_MODES, parse_mode
from specserve.core.stats import SpeculationStats
from specserve.flags import NO_FLAG, flag
from specserve.models.config import DTYPE_NAMES, QUANTIZATIONS
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET

PIPELINED, UNPIPELINED, EARLY_STOP = "pipelined", "unpipelined", "early-stop"
SHARED_CORES_PIPELINED, NO_SEQUENTIAL_STOP = "pipelined on shared cores", "no sequential stop"
SERVED_MODE_SUFFIXES = {
    PIPELINED: "", UNPIPELINED: " unpipelined", SHARED_CORES_PIPELINED: " pre-draft on shared cores",
    NO_SEQUENTIAL_STOP: " no early stop",
}  # fmt: skip
"""The bench's served modes: variant -> what its mode names add to "served k=N"."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """A `specserve bench latency` run: one request at a time, every mode on every prompt in turn."""

    target: str = field(default=DEFAULT_TARGET, metadata=flag("--target", "--model", metavar="MODEL"))
    """The target: a preset, a Hugging Face model id or a directory."""
    draft: str = field(default=DEFAULT_DRAFT, metadata=flag("--draft", "--speculative-model", metavar="DRAFT"))
    """The draft: a preset, a Hugging Face model id or a directory."""
    num_prompts: int = 10
    """Prompts measured per category, every mode on each."""
    max_tokens: int = 128
    """Tokens generated per request."""
    ks: tuple[int, ...] = field(default=(2, 4, 6, 8), metadata=flag(metavar="K"))
    """The k of each speculative mode."""
    target_dtype: str = field(default="auto", metadata=flag(choices=("auto", *DTYPE_NAMES)))
    """The target of the speculative and peer modes."""
    baseline_dtypes: tuple[str, ...] = field(default=("float32", "bfloat16"), metadata=flag(choices=DTYPE_NAMES))
    """Target-only is run in each; speedups are against the fastest target-only mode (HF's generate() too)."""
    draft_quantization: str = field(default="auto", metadata=flag(choices=QUANTIZATIONS))
    """The draft's weights (ModelConfig.quantization)."""
    stop_threshold: float = field(default=0.0, metadata=flag("--early-stop", metavar="THRESHOLD"))
    """Also run each k with the draft's early stop: a window ends after a token the draft gave less than
    this probability (HF's default schedule stops at 0.4); 0: not."""
    hf_ks: tuple[int, ...] = field(default=(4,), metadata=NO_FLAG)
    """Peer modes with a constant window; the peer also runs once with its own defaults."""
    hf: bool = True
    """Run the peer (Hugging Face assisted generation)."""
    hf_plain_target: bool = field(default=True, metadata=flag("--hf-plain"))
    """Also run the peer's target-only and default modes on a target loaded as transformers ships it, without
    specserve's prepacked weights and few-query attention (the peer's other modes get them, as they get the
    quantized draft)."""
    hf_fp32_draft: bool = field(default=True, metadata=flag("--fp32-draft"))
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
    ignore_eos: bool = field(default=True, metadata=NO_FLAG)
    """Generate exactly max_tokens in every mode, so all modes do the same work."""
    categories: tuple[str, ...] = field(default=("code",), metadata=flag("--categories", "--category"))
    """Workloads whose prompts are measured (specserve/bench/workloads.py), up to num_prompts of each;
    chat-style ones rendered through the target's chat template."""
    extra_drafts: tuple[str, ...] = field(default=(), metadata=flag("--drafts", metavar="DRAFT"))
    """With `served`: more draft services over the same target worker, each measured at adaptive k and at
    each k of `ks`, e.g. `ngram` (prompt lookup) or `MODEL+ngram` (the hybrid)."""
    peer_llama_cpp: str | None = field(default=None, metadata=flag("--peer-llama-cpp", metavar="BIN_DIR"))
    """Also run llama.cpp as a peer on the same GGUF files: llama-server from this llama.cpp build's bin folder
    (scripts/build_llama_cpp.sh builds the pinned version), as target-only, speculation and prompt lookup."""
    llama_cpp_draft_max: tuple[int, ...] = field(default=(3, 8), metadata=flag(metavar="N"))
    """llama.cpp's speculation modes: one per draft length (its --spec-draft-n-max)."""
    served_variants: tuple[str, ...] | None = field(
        default=None, metadata=flag(choices=tuple(SERVED_MODE_SUFFIXES), metavar="VARIANT")
    )
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
class SweepConfig:
    """A served sweep (`specserve bench load` / `rate`): the served stack's modes under many clients."""

    num_prompts: int = 10
    """Prompts per category; clients take them in turn."""
    max_tokens: int = 128
    """Tokens generated per request."""
    categories: tuple[str, ...] = field(default=("code",), metadata=flag("--categories", "--category"))
    """The workloads: code (HumanEval), chat, summarisation, translation, 'question answering', maths, edit
    (code to edit: answers repeat the prompt), long-N (specserve/bench/workloads.py)."""
    modes: tuple[str, ...] = field(default=DEFAULT_MODES, metadata=flag(metavar="MODE"))
    """target-only, k=N, adaptive, k=N+stop / adaptive+stop (the draft ends windows on low confidence), k=N@DRAFT /
    adaptive@DRAFT (over a draft of `drafts`); a mode with a label, e.g. target-only#2, runs again in turns of
    its own (its ratio to the mode: the noise)."""
    drafts: tuple[str, ...] = field(default=(), metadata=flag(metavar="DRAFT"))
    """More draft services to start over the same target worker, for modes such as adaptive@ngram."""
    confidence_threshold: float = 0.3
    """The draft's early stop in the '+stop' modes."""
    temperature: float = 0.0
    """0: greedy."""
    check_ties: bool = False
    """Greedy: afterwards, load the target here and check that every output departing from target-only's does
    so at a near-tie of the target's top two logits (exit status 1 if one does not)."""
    concurrency: tuple[int, ...] = ()
    """`load`: closed-loop clients at each of these concurrencies, each sending requests back to back."""
    requests_per_client: int = 2
    """`load`: requests each client sends per mode."""
    duration_s: float | None = field(default=None, metadata=flag("--duration", metavar="SECONDS"))
    """`load`: instead of requests_per_client, clients send requests until the end of a timed window and
    throughput counts the tokens of that window."""
    warmup_s: float = field(default=0.0, metadata=flag("--warmup", metavar="SECONDS"))
    """`load` with a duration: the window opens this long after every client's first token."""
    repeats: int = 1
    """`load`: the modes take turns this many times per load (spreads a shared machine's drift over all modes)."""
    request_rate: tuple[float, ...] = field(default=(), metadata=flag(metavar="RATE"))
    """`rate`: open-loop Poisson arrivals at each of these rates (requests per second)."""
    num_requests: int = 16
    """`rate`: requests per mode at each rate."""
    peer_llama_cpp: str | None = field(default=None, metadata=flag("--peer-llama-cpp", metavar="BIN_DIR"))
    """`load`, greedy: also run llama.cpp's llama-server from this build's bin folder on the same GGUF files, at
    N clients with N slots (-np N, continuous batching), target-only and its speculation with the draft model
    (which the pinned version runs with several slots), in turns with the served modes."""
    llama_cpp_draft_max: tuple[int, ...] = field(default=(3, 8), metadata=flag(metavar="N"))
    """`load` with the llama.cpp peer: one speculation mode per draft length (its --spec-draft-n-max)."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if self.check_ties and self.temperature != 0:
            raise ValueError("check_ties compares greedy outputs: it needs temperature 0")
        if self.peer_llama_cpp is not None and self.temperature != 0:
            raise ValueError(f"the llama.cpp peer runs greedy: temperature must be 0, got {self.temperature}")
        if not self.concurrency and not self.request_rate:
            raise ValueError("a sweep needs concurrency (closed loop) or request_rate (open loop)")
        unknown = sorted({m.draft for m in map(parse_mode, self.modes) if m.draft} - set(self.drafts))
        if unknown:
            raise ValueError(f"modes run over drafts {unknown} that drafts does not start")


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    """A `specserve bench overhead` run: the served stack's host time per round, at each client count."""

    ks: tuple[int, ...] = field(default=(4,), metadata=flag(metavar="K"))
    """The speculative modes' k (target-only is always measured)."""
    concurrency: tuple[int, ...] = (1, 16)
    """Client counts measured, each client sending requests back to back."""
    max_tokens: int = 256
    """Tokens generated per request."""
    requests_per_client: int = 2
    """Requests each client sends per mode and turn."""
    repeats: int = 2
    """Turns of all modes at each client count."""

    def __post_init__(self) -> None:
        if any(k < 1 for k in self.ks) or any(c < 1 for c in self.concurrency):
            raise ValueError(f"ks and concurrency must be >= 1, got {self.ks}, {self.concurrency}")
        if self.max_tokens < 2 or self.requests_per_client < 1 or self.repeats < 1:
            raise ValueError("max_tokens must be >= 2, requests_per_client and repeats >= 1")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    token_ids: list[int]


RunOutput = tuple[list[int], float, SpeculationStats | None, int]  # tokens, seconds, stats, peer target passes
Runner = Callable[[Prompt], RunOutput]
