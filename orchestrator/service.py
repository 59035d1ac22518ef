"""The orchestrator's state: the replica pools it keeps in step with its fleet, the tokenizer, defaults."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from orchestrator.admission import Admission
from orchestrator.metrics import Metrics, ReplicaState, ServingState
from orchestrator.pipeline import Chunk, RemoteRequest, RequestPlan
from orchestrator.remote import ModelInfo
from orchestrator.replicas import Fleet, Replica, ReplicaPool
from specserve.config import GenerationRequest
from specserve.models.tokenizers import TokenizerMismatchError
from specserve.prompts import MAX_NUM_SPECULATIVE_TOKENS, resolve_k, stop_conditions, tokenize_request
from specserve.security import TLSConfig

logger = logging.getLogger(__name__)

MAX_REPLICAS = 256  # per role: a typo guard for `specserve scale`


@dataclass(frozen=True, slots=True)
class OrchestratorConfig:
    num_speculative_tokens: int = 4
    """k when a request does not say and adaptive is off (0 when no draft serves)."""
    adaptive: bool = True
    """Requests that do not set k get adaptive speculation: up to max_adaptive_k drafts per round, following
    acceptance, the measured draft and target costs and the batch size; 0 when speculation would not pay.
    Seeded sampled requests keep the fixed k, so that they reproduce."""
    max_adaptive_k: int = 8
    draft_confidence_threshold: float = 0.0
    """The draft ends a window early after a token it gave less than this probability (0: never; exact
    either way: the target checks each drafted token as before)."""
    sequential_confidence_threshold: float = 0.4
    """The same, at least, for rounds that run one after the other (unpipelined, or on shared cores):
    there each draft step is paid in full, and a token the draft was unsure of is likely rejected.
    Pre-drafted rounds keep draft_confidence_threshold: a shorter window is less often accepted whole,
    and the pre-draft continues only whole acceptances. 0.4 is Hugging Face's default."""
    pipelined: bool = True
    """Pre-draft the next window while the target verifies this one."""
    yield_shared_cores: bool = True
    """On a draft and a target that share CPU cores (one machine, no GPU: specserve/placement.py), rounds
    run one after the other instead, the draft on every core, and the target's sessions take turns:
    all of them draft, then all verify (orchestrator/turns.py). False: pipelined, the draft on its share
    of the cores, regardless."""
    host: str = "127.0.0.1"
    """Interface of the public API; 0.0.0.0 opens it to the network."""
    port: int = 50051
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
    tls: TLSConfig | None = None
    """Serve the public and admin API over TLS. None: plaintext."""
    worker_tls: TLSConfig | None = None
    """Call the workers over TLS, presenting this certificate (mutual TLS). None: plaintext."""
    api_key: str | None = field(default=None, repr=False)
    """Every public and admin call must carry `authorization: Bearer <api_key>` (else UNAUTHENTICATED).
    None: no authentication (loopback and trusted networks only)."""

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
        if self.max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}")
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")


class Orchestrator:
    def __init__(
        self,
        config: OrchestratorConfig,
        fleet: Fleet,
        tokenizer: PreTrainedTokenizerBase,
        target_pool: ReplicaPool,
        draft_pool: ReplicaPool | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        assert target_pool.info is not None, "connect() admits a target replica first"
        self.config, self.fleet, self.tokenizer = config, fleet, tokenizer
        self.target_pool, self.draft_pool = target_pool, draft_pool
        self.pools = {"target": target_pool} | ({"draft": draft_pool} if draft_pool is not None else {})
        self._discovery: asyncio.Task[None] | None = None
        self.admission = Admission(config.max_concurrent_requests, config.max_queued_requests, config.queue_timeout_s)
        self.metrics = metrics or Metrics()
        self.metrics.watch(self._serving_state)

    @property
    def target_info(self) -> ModelInfo:
        assert self.target_pool.info is not None
        return self.target_pool.info

    @property
    def draft_info(self) -> ModelInfo | None:
        return self.draft_pool.info if self.draft_pool is not None else None

    @property
    def default_k(self) -> int:
        return self.config.num_speculative_tokens if self.draft_pool is not None else 0

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
        has_draft = self.draft_pool is not None
        # a seeded sample must reproduce, and its random draws depend on k: it keeps the fixed k
        seeded_sample = request.sampling.seed is not None and not request.sampling.greedy
        adaptive = self.config.adaptive and request.num_speculative_tokens is None and has_draft and not seeded_sample
        plan = RequestPlan(
            prompt_token_ids=prompt_token_ids,
            k=self.config.max_adaptive_k if adaptive else resolve_k(request, self.default_k, has_draft),
            sampling=request.sampling,
            stop=stop_conditions(request, info.eos_token_ids),
            max_context=info.max_context,
            vocab_size=info.vocab_size,
            pipelined=self.config.pipelined if pipelined is None else pipelined,
            yield_shared_cores=self.config.yield_shared_cores,
            failover_timeout_s=self.config.failover_timeout_s,
            adaptive=adaptive,
            draft_timeout_s=self.config.draft_timeout_s,
            confidence_threshold=self.config.draft_confidence_threshold,
            sequential_confidence_threshold=self.config.sequential_confidence_threshold,
        )
        return RemoteRequest(self.target_pool, self.draft_pool, plan, self.decode, self.admission)

    async def generate(self, request: GenerationRequest, api: str) -> AsyncGenerator[Chunk, None]:
        """What the public APIs (gRPC, HTTP) serve: start() then stream(), observed in self.metrics."""
        tracker = self.metrics.track(api)
        try:
            remote = self.start(request)
            async with contextlib.aclosing(remote.stream()) as chunks:  # a caller that leaves frees the sessions
                async for chunk in chunks:
                    tracker.observe_chunk(len(chunk.token_ids), chunk.decoder.result.stats)
                    yield chunk
        except BaseException as error:  # GeneratorExit and CancelledError too: counted, then re-raised
            tracker.finish(error)
            raise
        tracker.finish(None, remote.decoder.result.stats)

    def _serving_state(self) -> ServingState:
        replicas = [
            ReplicaState(role, r.address, r.state, r.num_sessions) for role in self.pools for r in self.replicas(role)
        ]
        return ServingState(self.admission.num_running, self.admission.num_queued, replicas)

    def decode(self, token_ids: list[int] | tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def replicas(self, role: str) -> list[Replica]:
        return list(self.pools[role].replicas.values()) if role in self.pools else []

    async def scale(self, role: str, num_replicas: int) -> None:
        """Start or stop replicas of `role`; replicas that stop are drained of their sessions first."""
        if role not in ("draft", "target"):
            raise ValueError(f"role must be draft or target, got {role!r}")
        pool = self.pools.get(role)
        if pool is None:
            raise ValueError("this deployment serves target-only: it has no draft model to scale")
        lowest = 1 if role == "target" else 0
        if not lowest <= num_replicas <= MAX_REPLICAS:
            raise ValueError(f"{role} replicas must be in [{lowest}, {MAX_REPLICAS}], got {num_replicas}")
        logger.info("scaling %s: %d -> %d replicas", role, self.fleet.desired(role), num_replicas)

        async def drain(addresses: list[str] | tuple[str, ...]) -> None:
            await pool.drain(addresses, self.config.drain_timeout_s)

        await self.fleet.scale(role, num_replicas, drain)
        await self.discover()

    async def discover(self) -> None:
        """Bring every pool in step with the fleet (a role that fails to answer keeps its replicas)."""
        for role, pool in self.pools.items():
            try:
                await pool.sync(await self.fleet.addresses(role))
            except Exception:  # noqa: BLE001 - a failed refresh must not end discovery
                logger.exception("discovery of %s replicas failed; retrying", role)

    def start_discovery(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(self.config.discovery_interval_s)
                await self.discover()

        self._discovery = asyncio.ensure_future(loop())

    async def close(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._discovery
        for pool in self.pools.values():
            await pool.close()
        await self.fleet.close()


def check_pair(draft_info: ModelInfo, target_info: ModelInfo) -> None:
    """Refuse a draft whose tokens mean something else to the target: mismatches fail silently otherwise.
    A token-agnostic draft (prompt lookup) proposes only ids of the session's own context: any target."""
    if draft_info.token_agnostic:
        return
    if draft_info.tokenizer_fingerprint != target_info.tokenizer_fingerprint:
        draft_fp, target_fp = draft_info.tokenizer_fingerprint[:12], target_info.tokenizer_fingerprint[:12]
        raise TokenizerMismatchError(
            f"draft {draft_info.model!r} and target {target_info.model!r} have different tokenizers "
            f"(fingerprints {draft_fp} vs {target_fp}); refusing to speculate across them"
        )
    if draft_info.max_context < target_info.max_context:
        raise ValueError(
            f"the draft's context ({draft_info.max_context}) is shorter than the target's ({target_info.max_context})"
        )
