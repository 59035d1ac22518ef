"""The orchestrator's gRPC server: finds the draft and target replicas through its fleet, checks that
their tokenizers match, then serves the public API and the admin API (scale, list replicas)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from orchestrator.http_api import HttpApi
from orchestrator.metrics import Metrics
from orchestrator.remote import DraftClient, ModelInfo, TargetClient
from orchestrator.replicas import Fleet, ReplicaPool
from orchestrator.service import Orchestrator, OrchestratorConfig, check_pair
from orchestrator.servicer import AdminServicer, OrchestratorServicer
from protos import specserve_pb2 as pb
from specserve.logs import RequestIdClientInterceptor
from specserve.models.loading import load_tokenizer
from specserve.rpc import Server, add_service

logger = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Orchestrator"]
ADMIN = pb.DESCRIPTOR.services_by_name["Admin"]


async def connect(config: OrchestratorConfig, fleet: Fleet, ready_timeout_s: float = 900.0) -> Orchestrator:
    """Wait for the first target (and draft) replica, check that they pair, then keep in step with the fleet."""
    metrics = Metrics()
    interceptors = [RequestIdClientInterceptor(metrics.observe_rpc)]  # request ids out, call latencies in
    observe = metrics.observe_rpc  # the round calls on streams
    target_pool = ReplicaPool(
        "target",
        functools.partial(TargetClient, tls=config.worker_tls, interceptors=interceptors, observe=observe),
    )
    pools = [target_pool]
    draft_pool = None
    if fleet.desired("draft") > 0:
        draft_pool = ReplicaPool(
            "draft",
            functools.partial(DraftClient, tls=config.worker_tls, interceptors=interceptors, observe=observe),
            check=lambda info: check_pair(info, _info(target_pool)),
        )
        pools.append(draft_pool)
    try:
        deadline = asyncio.get_running_loop().time() + ready_timeout_s
        for pool in pools:  # the target first: the draft is checked against it
            while pool.info is None:
                await pool.sync(await fleet.addresses(pool.role))
                if pool.refused and pool.info is None:
                    raise next(iter(pool.refused.values()))
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"no {pool.role} replica served within {ready_timeout_s:.0f}s")
                if pool.info is None:
                    await asyncio.sleep(0.2)
        tokenizer = await asyncio.to_thread(load_tokenizer, _info(target_pool).model)
    except BaseException:
        for pool in pools:
            await pool.close()
        raise
    orchestrator = Orchestrator(config, fleet, tokenizer, target_pool, draft_pool, metrics)
    orchestrator.start_discovery()
    return orchestrator


def _info(pool: ReplicaPool) -> ModelInfo:
    assert pool.info is not None
    return pool.info


async def serve(
    config: OrchestratorConfig,
    fleet: Fleet,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    grace_s: float | None = None,
    ready_timeout_s: float = 900.0,
    on_http_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve until `stop` is set; then refuse new calls and give those in flight `grace_s` (default: the
    config's shutdown_grace_s) to finish. on_http_listening gets the HTTP API's base URL."""
    grace_s = config.shutdown_grace_s if grace_s is None else grace_s
    orchestrator = await connect(config, fleet, ready_timeout_s)
    server = Server([SERVICE.full_name, ADMIN.full_name], tls=config.tls, api_key=config.api_key)
    add_service(server.server, OrchestratorServicer(orchestrator), SERVICE)
    add_service(server.server, AdminServicer(orchestrator), ADMIN)
    address = server.bind(config.host, config.port)
    await server.start()
    await server.set_serving()
    logger.info(
        "specserve orchestrator listening on %s (target %s x%d, draft %s x%d; k: %s)",
        address,
        orchestrator.target_info.model,
        len(orchestrator.replicas("target")),
        orchestrator.draft_info.model if orchestrator.draft_info else "none",
        len(orchestrator.replicas("draft")),
        config.describe_k(orchestrator.draft_info is not None),
    )
    http = None
    if config.http_port is not None:
        http = HttpApi(orchestrator, config.api_key, config.tls)
        try:
            url = await http.start(config.host, config.http_port, grace_s)
        except BaseException:
            await server.stop(0)
            await orchestrator.close()
            raise
        logger.info("OpenAI-compatible HTTP API on %s/v1, metrics on %s/metrics", url, url)
        if on_http_listening is not None:
            on_http_listening(url)
    if on_listening is not None:
        on_listening(address)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        logger.info("stopping: refusing new requests, draining those in flight (up to %.0fs)", grace_s)
        await asyncio.gather(server.stop(grace_s), *([http.stop()] if http is not None else []))
        await orchestrator.close()
