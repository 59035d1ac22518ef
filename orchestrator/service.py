"""The orchestrator's state: the replica pools it keeps in step with its fleet, the tokenizer, defaults."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import cast

from transformers import PreTrainedTokenizerBase

from orchestrator.admission import Admission
from orchestrator.config import OrchestratorConfig
from orchestrator.metrics import GIVEN_UP, Metrics, ReplicaState, ServingState
from orchestrator.pipeline import Chunk, RemoteRequest, RequestPlan
from orchestrator.remote import ModelInfo
from orchestrator.replicas import Fleet, Replica, ReplicaPool
from specserve.config import GenerationRequest
from specserve.models.tokenizers import TokenizerMismatchError, unscored_ids
from specserve.prompts import resolve_k, stop_conditions, tokenize_request

logger = logging.getLogger(__name__)

MAX_REPLICAS = 256  # per role: a typo guard for `specserve scale`


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
        """The fixed k (requests that do not set k when adaptive is off; seeded samples)."""
        return self.config.num_speculative_tokens if self.draft_pool is not None else 0

    @property
    def adaptive(self) -> bool:
        """Requests that do not set k get adaptive k in 0..max_adaptive_k (seeded samples excepted)."""
        return self.config.adaptive and self.draft_pool is not None

    @property
    def max_adaptive_k(self) -> int:
        return self.config.max_adaptive_k if self.adaptive else 0

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
        adaptive = self.adaptive and request.num_speculative_tokens is None and not seeded_sample
        plan = RequestPlan(
            prompt_token_ids=prompt_token_ids,
            k=self.config.max_adaptive_k if adaptive else resolve_k(request, self.default_k, has_draft),
            sampling=request.sampling,
            stop=stop_conditions(request, info.eos_token_ids),
            max_context=info.max_context,
            vocab_size=info.vocab_size,
            config=self.config,
            pipelined=self.config.pipelined if pipelined is None else pipelined,
            adaptive=adaptive,
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
        replicas += [ReplicaState(role, g.name, GIVEN_UP, 0) for role in self.pools for g in self.fleet.given_up(role)]
        failures = {role: self.fleet.num_load_failures(role) for role in self.pools}
        return ServingState(self.admission.num_running, self.admission.num_queued, replicas, failures)

    def decode(self, token_ids: Sequence[int]) -> str:
        # One flat list of ids decodes to one string (transformers' stub also allows a batch's list[str]).
        return cast(str, self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

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

        async def drain(addresses: Sequence[str]) -> None:
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
    Logits widths may differ (Qwen2.5-7B pads to 152,064 rows, 0.5B to 151,936): both sides mask the rows
    past the shared tokenizer's ids. A token-agnostic draft (prompt lookup) proposes only ids of the
    session's own context: any target."""
    if draft_info.token_agnostic:
        return
    if draft_info.tokenizer_fingerprint != target_info.tokenizer_fingerprint:
        draft_fp, target_fp = draft_info.tokenizer_fingerprint[:12], target_info.tokenizer_fingerprint[:12]
        sizes = ""
        if draft_info.vocab_size != target_info.vocab_size:
            sizes = f"; {draft_info.vocab_size} vs {target_info.vocab_size} token ids"
        raise TokenizerMismatchError(
            f"draft {draft_info.model!r} and target {target_info.model!r} have different tokenizers "
            f"(fingerprints {draft_fp} vs {target_fp}{sizes}); refusing to speculate across them"
        )
    for role, info in (("draft", draft_info), ("target", target_info)):
        if (problem := unscored_ids(role, info.vocab_size, info.padded_vocab_size)) is not None:
            raise TokenizerMismatchError(f"{info.model!r}: {problem}")
    if draft_info.max_context < target_info.max_context:
        raise ValueError(
            f"the draft's context ({draft_info.max_context}) is shorter than the target's ({target_info.max_context})"
        )
