"""The orchestrator's settings (no model library: the CLI and deploy configs build it before loading)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.flags import NO_FLAG, flag
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS
from specserve.security import TLSConfig


@dataclass(frozen=True, slots=True)
class OrchestratorConfig:
    num_speculative_tokens: int = field(default=4, metadata=flag("-k", "--num-speculative-tokens", metavar="K"))
    """The fixed k: drafts per round for requests that do not set k when adaptive is off, and for seeded
    sampled requests always (0 when no draft serves). `--num-speculative-tokens` sets it, adaptive off."""
    adaptive: bool = True
    """Requests that do not set k get adaptive speculation: 0..max_adaptive_k drafts per round, following
    acceptance, the measured draft and target costs and the batch size; 0 when speculation would not pay.
    Seeded sampled requests keep the fixed k, so that they reproduce. A request that sets k gets that k."""
    max_adaptive_k: int = field(default=8, metadata=flag("--max-adaptive-k", "--max-speculative-tokens", metavar="K"))
    """Adaptive k's bound (`--max-speculative-tokens`)."""
    draft_confidence_threshold: float = 0.0
    """The draft ends a window early after a token it gave less than this probability (0: never; exact
    either way: the target checks each drafted token as before)."""
    sequential_confidence_threshold: float = 0.4
    """The same, at least, for rounds that run one after the other (unpipelined, or on shared cores):
    there each draft step is paid in full, and a token the draft was unsure of is likely rejected.
    Pre-drafted rounds keep draft_confidence_threshold: a shorter window is less often accepted whole,
    and the pre-draft continues only whole acceptances. 0.4 is Hugging Face's default."""
    target_only_run_tokens: int = 16
    """Target-only rounds of adaptive k (k = 0) ask the target for up to this many tokens in one call, decoded
    back to back and sent back one by one as they come (a run), instead of a call per token; a request at a
    fixed k = 0 runs to its end in one call. 1: a call per token."""
    pipelined: bool = field(default=True, metadata=flag("--pipelined", "--pipeline"))
    """Pre-draft the next window while the target verifies this one."""
    yield_shared_cores: bool = True
    """On a draft and a target that share CPU cores (one machine, no GPU: specserve/placement.py), rounds
    run one after the other instead, the draft on every core, and the target's sessions take turns:
    all of them draft, then all verify (orchestrator/turns.py). False: pipelined, the draft on its share
    of the cores, regardless."""
    host: str = "127.0.0.1"
    """Interface of the public API; 0.0.0.0 opens it to the network."""
    port: int = 50051
    """Port of the public gRPC API (and the admin API); 0 picks a free port."""
    http_port: int | None = 8000
    """Port of the OpenAI-compatible HTTP API and /metrics, on `host`; 0 picks a free port, None turns it off."""
    discovery_interval_s: float = 1.0
    """How often the replica list is refreshed from the fleet (new, restarted and removed replicas)."""
    failover_timeout_s: float = 120.0
    """How long a request waits for a usable target replica before UNAVAILABLE."""
    drain_timeout_s: float = 60.0
    """Scaling down waits this long for a replica's sessions to finish; the rest then move elsewhere."""
    max_concurrent_requests: int = 128
    """Requests decoding at once (each holds a KV cache on a target and a draft replica); keep it within
    the replicas' max_sessions, past which workers evict sessions and requests prefill again."""
    max_queued_requests: int = 512
    """Requests waiting for a slot beyond those; more are refused at once with RESOURCE_EXHAUSTED and a
    retry hint (trailing metadata `retry-after-ms`)."""
    queue_timeout_s: float = 30.0
    """A queued request waits this long for a slot, then is refused the same way."""
    draft_timeout_s: float = 5.0
    """A draft that takes longer than this to propose is not waited for: that round goes target-only (the
    request drafts again a little later). Lossless; it bounds what a slow draft costs a round."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM: new requests are refused (UNAVAILABLE, health NOT_SERVING) and the ones in flight get
    this long to finish before they are cancelled."""
    tls: TLSConfig | None = field(default=None, metadata=NO_FLAG)
    """Serve the public and admin API over TLS. None: plaintext."""
    worker_tls: TLSConfig | None = field(default=None, metadata=NO_FLAG)
    """Call the workers over TLS, presenting this certificate (mutual TLS). None: plaintext."""
    api_key: str | None = field(default=None, repr=False, metadata=NO_FLAG)
    """Every public and admin call must carry `authorization: Bearer <api_key>` (else UNAUTHENTICATED).
    None: no authentication (loopback and trusted networks only)."""

    def describe_k(self, has_draft: bool) -> str:
        """What requests that do not set k get, for the banner: "adaptive 0..8", "fixed 4", "0 (no draft)"."""
        if not has_draft:
            return "0 (no draft)"
        if self.adaptive:
            return f"adaptive 0..{self.max_adaptive_k} (seeded samples: fixed {self.num_speculative_tokens})"
        return f"fixed {self.num_speculative_tokens}" + (" (target-only)" if self.num_speculative_tokens == 0 else "")

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty or blank; None turns authentication off")
        if not 0 <= self.num_speculative_tokens <= MAX_NUM_SPECULATIVE_TOKENS:
            k, limit = self.num_speculative_tokens, MAX_NUM_SPECULATIVE_TOKENS
            raise ValueError(f"num_speculative_tokens must be in [0, {limit}], got {k}")
        if not 1 <= self.max_adaptive_k <= MAX_NUM_SPECULATIVE_TOKENS:
            raise ValueError(f"max_adaptive_k must be in [1, {MAX_NUM_SPECULATIVE_TOKENS}], got {self.max_adaptive_k}")
        for name in ("draft_confidence_threshold", "sequential_confidence_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be in [0, 65535] or None (no HTTP API), got {self.http_port}")
        for name in ("discovery_interval_s", "failover_timeout_s", "drain_timeout_s", "queue_timeout_s",
                     "draft_timeout_s"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.target_only_run_tokens < 1:
            raise ValueError(f"target_only_run_tokens must be >= 1, got {self.target_only_run_tokens}")
        if self.max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}")
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
