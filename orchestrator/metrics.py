"""The orchestrator's Prometheus metrics (served at /metrics by the HTTP API): what requests got, how
speculation went round by round, and what the replicas and internal calls are doing. The request's stats
stay a dataclass (core/stats.py); this module only exports them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specserve.core.stats import SpeculationStats
from specserve.rpc import status_for

logger = logging.getLogger(__name__)
disable_created_metrics()  # no *_created series: they double the output and no panel reads them

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
RATE_BUCKETS = tuple(i / 10 for i in range(11))
COUNT_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
THROUGHPUT_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)


GIVEN_UP = "given_up"  # the state of a replica the fleet stopped restarting (orchestrator/replicas.py GivenUp)


@dataclass(frozen=True, slots=True)
class ReplicaState:
    role: str
    address: str  # a given-up replica's name
    state: str  # serving | draining | failed | given_up
    num_sessions: int


@dataclass(frozen=True, slots=True)
class ServingState:
    """What the orchestrator holds at a scrape: its admission queue and its replicas."""

    num_running: int
    num_queued: int
    replicas: list[ReplicaState] = field(default_factory=list)
    num_load_failures: dict[str, int] = field(default_factory=dict)
    """By role: replica processes that died while loading, since start."""


class Metrics:
    """One registry per orchestrator (tests run several in a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "specserve_requests", "Requests ended, by API (grpc, http) and status (ok, or the gRPC status name "
            "in lower case: invalid_argument, resource_exhausted, unavailable, unauthenticated, cancelled, ...)",
            ["api", "status"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("specserve_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("specserve_generation_tokens", "Tokens generated", registry=r)
        self.acceptance_rate = Histogram(
            "specserve_request_acceptance_rate", "Per request: accepted / proposed drafts (requests that drafted)",
            buckets=RATE_BUCKETS, registry=r,
        )  # fmt: skip
        self.accepted_per_round = Histogram(
            "specserve_accepted_tokens_per_round", "Drafts the target accepted in one round (bonus token excluded)",
            buckets=COUNT_BUCKETS, registry=r,
        )  # fmt: skip
        self.speculation_length = Histogram(
            "specserve_speculation_length", "k: drafts proposed in one round (0: a target-only round)",
            buckets=COUNT_BUCKETS, registry=r,
        )  # fmt: skip
        self.draft_tokens_proposed = Counter(
            "specserve_draft_tokens_proposed", "Draft tokens proposed, by the drafter that made them (source: "
            "model, ngram: prompt lookup)", ["source"], registry=r,
        )  # fmt: skip
        self.draft_tokens_accepted = Counter(
            "specserve_draft_tokens_accepted", "Draft tokens the target accepted, by the drafter that made them",
            ["source"], registry=r,
        )  # fmt: skip
        self.tokens_per_second = Histogram(
            "specserve_request_tokens_per_second", "Per request: generated tokens / seconds from arrival to end",
            buckets=THROUGHPUT_BUCKETS, registry=r,
        )  # fmt: skip
        self.time_to_first_token = Histogram(
            "specserve_time_to_first_token_seconds", "From arrival (queueing included) to the first token",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.time_per_output_token = Histogram(
            "specserve_time_per_output_token_seconds", "Per request: (end - first token) / (tokens - 1)",
            buckets=TOKEN_TIME_BUCKETS, registry=r,
        )  # fmt: skip
        self.request_duration = Histogram(
            "specserve_request_duration_seconds", "From arrival to the last token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.rpc_duration = Histogram(
            "specserve_rpc_duration_seconds", "Calls from the orchestrator to the workers, as the orchestrator waits",
            ["service", "method", "code"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._state: Callable[[], ServingState] | None = None
        r.register(_StateCollector(self))

    def watch(self, state: Callable[[], ServingState]) -> None:
        """Read the queue and the replicas from `state` at each scrape."""
        self._state = state

    def track(self, api: str) -> RequestTracker:
        return RequestTracker(self, api)

    def observe_refused(self, api: str, status: str) -> None:
        """A request refused before generation began (malformed, unauthenticated, unknown model)."""
        self.requests.labels(api, status).inc()

    def observe_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """method: "/specserve.v1.TargetService/Verify"."""
        service, _, name = method.lstrip("/").rpartition("/")
        self.rpc_duration.labels(service.rsplit(".", 1)[-1], name, code.name).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """One request's way into the metrics: observe_chunk per streamed chunk, finish once."""

    def __init__(self, metrics: Metrics, api: str) -> None:
        self.metrics, self.api = metrics, api
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self._rounds = self._proposed = self._accepted = 0
        self._by_source: dict[str, tuple[int, int]] = {}  # source -> (proposed, accepted) counted so far

    def observe_chunk(self, num_tokens: int, stats: SpeculationStats) -> None:
        now = time.perf_counter()
        if num_tokens and self.first_token_at is None:
            self.first_token_at = now
            self.metrics.time_to_first_token.observe(now - self.started)
        rounds = stats.num_rounds - self._rounds
        if rounds > 0:  # a chunk is one round's output; several only when some emitted nothing
            proposed, accepted = stats.num_proposed - self._proposed, stats.num_accepted - self._accepted
            for _ in range(rounds):
                self.metrics.speculation_length.observe(proposed / rounds)
                self.metrics.accepted_per_round.observe(accepted / rounds)
            self._rounds, self._proposed, self._accepted = stats.num_rounds, stats.num_proposed, stats.num_accepted
        for source, proposed in stats.proposed_by_source.items():
            accepted = stats.accepted_by_source.get(source, 0)
            seen_proposed, seen_accepted = self._by_source.get(source, (0, 0))
            if proposed > seen_proposed:
                self.metrics.draft_tokens_proposed.labels(source).inc(proposed - seen_proposed)
                self.metrics.draft_tokens_accepted.labels(source).inc(accepted - seen_accepted)
                self._by_source[source] = (proposed, accepted)

    def finish(self, error: BaseException | None, stats: SpeculationStats | None = None) -> None:
        m = self.metrics
        if error is not None:
            cancelled = isinstance(error, (asyncio.CancelledError, GeneratorExit))
            status = "cancelled" if cancelled else status_for(error).name.lower()
            m.requests.labels(self.api, status).inc()
            logger.info("request ended: %s (%s)", status, error if not cancelled else "the caller went away")
            return
        m.requests.labels(self.api, "ok").inc()
        if stats is None:
            return
        now = time.perf_counter()
        elapsed = now - self.started
        m.prompt_tokens.inc(stats.num_prompt_tokens)
        m.generation_tokens.inc(stats.num_generated)
        m.request_duration.observe(elapsed)
        if stats.num_proposed:
            m.acceptance_rate.observe(stats.acceptance_rate)
        if stats.num_generated and elapsed > 0:
            m.tokens_per_second.observe(stats.num_generated / elapsed)
        if stats.num_generated > 1 and self.first_token_at is not None:
            m.time_per_output_token.observe((now - self.first_token_at) / (stats.num_generated - 1))
        logger.info(
            "request ok: %d prompt + %d generated tokens in %.2fs (%.1f tok/s), accepted %d/%d drafts over %d rounds",
            stats.num_prompt_tokens, stats.num_generated, elapsed, stats.num_generated / elapsed if elapsed else 0.0,
            stats.num_accepted, stats.num_proposed, stats.num_rounds,
        )  # fmt: skip


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        running = GaugeMetricFamily("specserve_requests_running", "Requests holding a decoding slot")
        queued = GaugeMetricFamily("specserve_requests_queued", "Requests waiting for a slot (queue depth)")
        sessions = GaugeMetricFamily(
            "specserve_replica_sessions", "Active sessions per replica", labels=["role", "replica"]
        )
        replicas = GaugeMetricFamily("specserve_replicas", "Replicas by role and state (given_up: died while "
                                     "loading max_load_failures times in a row, not restarted)",
                                     labels=["role", "state"])  # fmt: skip
        load_failures = CounterMetricFamily(
            "specserve_replica_load_failures", "Replica processes that died while loading their model",
            labels=["role"],
        )  # fmt: skip
        if self.metrics._state is not None:
            state = self.metrics._state()
            running.add_metric([], state.num_running)
            queued.add_metric([], state.num_queued)
            counts: dict[tuple[str, str], int] = {}
            for replica in state.replicas:
                if replica.state != GIVEN_UP:
                    sessions.add_metric([replica.role, replica.address], replica.num_sessions)
                counts[replica.role, replica.state] = counts.get((replica.role, replica.state), 0) + 1
            for (role, replica_state), count in sorted(counts.items()):
                replicas.add_metric([role, replica_state], count)
            for role, count in sorted(state.num_load_failures.items()):
                load_failures.add_metric([role], count)
        yield from (running, queued, sessions, replicas, load_failures)
