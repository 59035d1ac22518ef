"""The target gRPC server: `python -m target_service --model NAME --port N`, or serve() from code."""

from __future__ import annotations

from typing import Any

from protos import specserve_pb2 as pb
from specserve.config import WorkerServiceConfig
from specserve.models.loading import load_model
from specserve.worker.serve import Role
from specserve.worker.serve import serve as serve_role
from target_service.servicer import TargetServicer
from target_service.worker import TargetWorker

SERVICE = pb.DESCRIPTOR.services_by_name["TargetService"]


def make_target_worker(config: WorkerServiceConfig) -> TargetWorker:
    return TargetWorker(load_model(config.model), config.max_sessions, config.idle_ttl_s)


TARGET = Role("target", SERVICE, TargetServicer, make_target_worker)


async def serve(config: WorkerServiceConfig, **hooks: Any) -> None:
    """The worker runtime's serve() in the target role; `hooks` as there (on_listening, stop, ...)."""
    await serve_role(TARGET, config, **hooks)
