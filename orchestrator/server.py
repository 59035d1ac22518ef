"""The orchestrator's gRPC server: finds the draft and target replicas through its fleet, checks that
their tokenizers match, then serves the public API and the admin API (scale, list replicas)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from orchestrator.remote import DraftClient, ModelInfo, TargetClient
from orchestrator.replicas import Fleet, ReplicaPool
from orchestrator.service import Orchestrator, OrchestratorConfig, check_pair
from orchestrator.servicer import AdminServicer, OrchestratorServicer
from protos import specserve_pb2 as pb
from specserve.models.loading import load_tokenizer
from specserve.rpc import Server, add_service

logger = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Orchestrator"]
ADMIN = pb.DESCRIPTOR.services_by_name["Admin"]


async def connect(config: OrchestratorConfig, fleet: Fleet, ready_timeout_s: float = 900.0) -> Orchestrator:
    """Wait for the first target (and draft) replica, check that they pair, then keep in step with the fleet."""
    target_pool = ReplicaPool("target", TargetClient)
    pools = [target_pool]
    draft_pool = None
    if fleet.desired("draft") > 0:
        draft_pool = ReplicaPool("draft", DraftClient, check=lambda info: check_pair(info, _info(target_pool)))
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
    orchestrator = Orchestrator(config, fleet, tokenizer, target_pool, draft_pool)
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
    grace_s: float = 10.0,
    ready_timeout_s: float = 900.0,
) -> None:
    orchestrator = await connect(config, fleet, ready_timeout_s)
    server = Server([SERVICE.full_name, ADMIN.full_name])
    add_service(server.server, OrchestratorServicer(orchestrator), SERVICE)
    add_service(server.server, AdminServicer(orchestrator), ADMIN)
    address = server.bind(config.host, config.port)
    await server.start()
    await server.set_serving()
    logger.info(
        "specserve orchestrator listening on %s (target %s x%d, draft %s x%d, k=%d)",
        address,
        orchestrator.target_info.model,
        len(orchestrator.replicas("target")),
        orchestrator.draft_info.model if orchestrator.draft_info else "none",
        len(orchestrator.replicas("draft")),
        orchestrator.default_k,
    )
    if on_listening is not None:
        on_listening(address)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await server.stop(grace_s)
        await orchestrator.close()
