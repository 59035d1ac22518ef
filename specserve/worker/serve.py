"""serve(role, config): one worker process's gRPC server. Listens at once, loads the model on the model
thread, serves until told to stop, evicts idle sessions meanwhile, then drains."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import torch
from google.protobuf.descriptor import ServiceDescriptor

from specserve.config import WorkerServiceConfig
from specserve.rpc import Server, add_service
from specserve.worker.servicer import SessionServicer

logger = logging.getLogger(__name__)

EVICT_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class Role:
    """What the draft and the target worker differ in; everything else is this runtime's."""

    name: str
    """"draft" or "target": for the log."""
    service: ServiceDescriptor
    """The gRPC service (specserve.v1) that `servicer` implements."""
    servicer: type[SessionServicer]
    """Decodes the role's requests, runs them on the model thread, encodes the answers."""
    make_worker: Callable[[WorkerServiceConfig], Any]
    """Loads the model and returns the worker holding it and its sessions; runs on the model thread."""


async def serve(
    role: Role,
    config: WorkerServiceConfig,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    on_serving: Callable[[], None] | None = None,
) -> None:
    """Serve `role` until `stop` is set (health NOT_SERVING until the model has loaded). on_listening gets
    the address once bound; on_serving is called once the model is loaded."""
    servicer = role.servicer(config.max_batch_size, config.prefill_chunk_tokens)
    server = Server([role.service.full_name], interceptors=interceptors, tls=config.tls)
    add_service(server.server, servicer, role.service)
    address = server.bind(config.host, config.port)
    await server.start()
    logger.info("%s worker listening on %s (loading the model)", role.name, address)
    if on_listening is not None:
        on_listening(address)
    try:
        # on the model's own thread: with OpenMP (torch's CPU threads), every thread that runs parallel work
        # gets a team of its own, and more team threads than cores make libgomp stop spin-waiting between
        # parallel regions. A load on another thread slowed each later pass by 12-30% here (a futex
        # wake-up per region, ~800 per pass).
        worker = await servicer.executor.run(role.make_worker, config)
        servicer.attach(worker)
        loaded = getattr(worker, "loaded", None)  # a prompt-lookup draft loads no model
        servicer.executor.inline_below_s = _inline_below_s(config, loaded.device if loaded else None)
        await server.set_serving()
        logger.info("%s worker serving on %s", role.name, address)
        if on_serving is not None:
            on_serving()
        await _evict_until(stop or asyncio.Event(), worker)
    finally:
        servicer.stopping = True
        await server.stop()
        servicer.executor.shutdown()


def _inline_below_s(config: WorkerServiceConfig, device: torch.device | None) -> float:
    """Short passes run on the loop's thread only where that makes no second OpenMP team beside the model
    thread's (see the load above): on a GPU, with one CPU thread, or without a model (prompt lookup)."""
    no_team = device is None or device.type == "cuda" or torch.get_num_threads() == 1
    return config.inline_pass_ms / 1000 if no_team else 0.0


async def _evict_until(stop: asyncio.Event, worker: Any) -> None:
    """Evict idle sessions every EVICT_EVERY_S until `stop` is set."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), EVICT_EVERY_S)
        except TimeoutError:
            evicted = worker.sessions.evict_idle()
            if evicted:
                logger.info("evicted %d idle sessions", len(evicted))
