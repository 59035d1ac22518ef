"""The orchestrator's gRPC server: connects to the draft and target services, checks that their
tokenizers match, then serves the public API."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.remote import DraftClient, TargetClient
from orchestrator.service import Orchestrator, OrchestratorConfig
from orchestrator.servicer import OrchestratorServicer
from protos import specserve_pb2 as pb
from specserve.models.loading import load_tokenizer
from specserve.rpc import Server, add_service

logger = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Orchestrator"]


async def wait_until_serving(channel: grpc.aio.Channel, service: str, timeout_s: float) -> None:
    """Poll the standard health service until `service` is SERVING (workers load their model first)."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{service} did not become SERVING within {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


async def connect(config: OrchestratorConfig, ready_timeout_s: float = 900.0) -> Orchestrator:
    target = TargetClient(config.target_address)
    await wait_until_serving(target.channel, "specserve.v1.TargetService", ready_timeout_s)
    target_info = await target.model_info()
    draft = draft_info = None
    if config.draft_address is not None:
        draft = DraftClient(config.draft_address)
        await wait_until_serving(draft.channel, "specserve.v1.DraftService", ready_timeout_s)
        draft_info = await draft.model_info()
    tokenizer = await asyncio.to_thread(load_tokenizer, target_info.model)
    return Orchestrator(config, tokenizer, target, target_info, draft, draft_info)


async def serve(
    config: OrchestratorConfig,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    grace_s: float = 10.0,
) -> None:
    orchestrator = await connect(config)
    server = Server([SERVICE.full_name])
    add_service(server.server, OrchestratorServicer(orchestrator), SERVICE)
    address = server.bind(config.host, config.port)
    await server.start()
    await server.set_serving()
    logger.info(
        "specserve orchestrator listening on %s (target %s, draft %s, k=%d)",
        address,
        orchestrator.target_info.model,
        orchestrator.draft_info.model if orchestrator.draft_info else "none",
        orchestrator.default_k,
    )
    if on_listening is not None:
        on_listening(address)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await server.stop(grace_s)
        await orchestrator.close()
