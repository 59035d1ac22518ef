"""The draft gRPC server: `python -m draft_service --model NAME --port N`, or serve() from code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc

from draft_service.servicer import DraftServicer
from draft_service.worker import DraftWorker
from protos import specserve_pb2 as pb
from specserve.config import WorkerServiceConfig
from specserve.models.loading import load_model
from specserve.rpc import serve_worker

SERVICE = pb.DESCRIPTOR.services_by_name["DraftService"]


async def serve(
    config: WorkerServiceConfig,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    on_serving: Callable[[], None] | None = None,
) -> None:
    def make_worker() -> DraftWorker:
        return DraftWorker(load_model(config.model), config.max_sessions, config.idle_ttl_s, config.slot_cache())

    await serve_worker(
        DraftServicer(config.max_batch_size, config.prefill_chunk_tokens),
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
