"""The target gRPC server: `python -m target_service --model NAME --port N`, or serve() from code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc

from protos import specserve_pb2 as pb
from specserve.config import WorkerServiceConfig
from specserve.models.loading import load_model
from specserve.rpc import serve_worker
from target_service.servicer import TargetServicer
from target_service.worker import TargetWorker

SERVICE = pb.DESCRIPTOR.services_by_name["TargetService"]


async def serve(
    config: WorkerServiceConfig,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    on_serving: Callable[[], None] | None = None,
) -> None:
    def make_worker() -> TargetWorker:
        return TargetWorker(load_model(config.model), config.max_sessions, config.idle_ttl_s)

    await serve_worker(
        TargetServicer(config.max_batch_size, config.prefill_chunk_tokens),
        SERVICE,
        make_worker,
        config.host,
        config.port,
        on_listening,
        stop,
        interceptors=interceptors,
        tls=config.tls,
        on_serving=on_serving,
    )
