"""`specserve serve`: join (or start) a Ray cluster, place the draft and target replicas as actors,
and serve the orchestrator from this process over them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable

import ray

from deploy.config import ROLES, DeployConfig, RoleConfig
from deploy.fleet import RayFleet
from orchestrator.server import serve as serve_orchestrator

logger = logging.getLogger(__name__)

LOCAL_HEADROOM = 4  # the local instance offers this many times the launch demand, so `scale` can grow


def init_ray(config: DeployConfig) -> DeployConfig:
    """Connect to the configured cluster, or start a local instance sized for the config. On a local
    machine without GPUs, roles that ask for GPUs run on its CPUs instead (the same config runs)."""
    if config.ray.address is not None:
        ray.init(address=config.ray.address, namespace=config.ray.namespace, log_to_driver=True)
        logger.info("joined the Ray cluster at %s: %s", config.ray.address, ray.cluster_resources())
        return config
    config = _on_this_machine(config)
    demand = _demand(config)
    logging.getLogger(RAY_AUTH_LOGGER).addFilter(_quiet_default_token_auth)
    ray.init(
        address="local",  # never a cluster that RAY_ADDRESS happens to name
        namespace=config.ray.namespace,
        num_cpus=max(os.cpu_count() or 1, int(LOCAL_HEADROOM * demand.pop("CPU", 0) + 0.999)),
        resources={name: LOCAL_HEADROOM * amount for name, amount in demand.items() if name != "GPU"},
        include_dashboard=False,
        log_to_driver=True,
    )
    auth = "on" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "off"  # ray.init sets it
    logger.info("started a local Ray instance (token authentication %s): %s", auth, ray.cluster_resources())
    return config


RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _quiet_default_token_auth(record: logging.LogRecord) -> bool:
    """Drop Ray's warning, on every local start, that it turned token authentication on: its default, kept.
    Its warning that authentication is off still shows."""
    return not record.getMessage().startswith("Token authentication is enabled")


def _on_this_machine(config: DeployConfig) -> DeployConfig:
    """Everything on loopback; GPU requests dropped when this machine has none."""
    import torch

    if config.ray.worker_host == "node-ip":
        config = dataclasses.replace(config, ray=dataclasses.replace(config.ray, worker_host="127.0.0.1"))
    if torch.cuda.is_available():
        return config
    changes: dict[str, RoleConfig] = {}
    for role in ROLES:
        role_config = config.role(role)
        if role_config is not None and (role_config.num_gpus or role_config.accelerator_type):
            logger.warning("this machine has no GPU: the %s runs on its CPUs", role)
            changes[role] = dataclasses.replace(role_config, num_gpus=0.0, accelerator_type=None)
    return dataclasses.replace(config, **changes)


def _demand(config: DeployConfig) -> dict[str, float]:
    demand: dict[str, float] = {}
    for role in ROLES:
        role_config = config.role(role)
        if role_config is not None:
            for name, amount in role_config.ray_resources().items():
                demand[name] = demand.get(name, 0.0) + amount * max(role_config.replicas, 1)
    return demand


async def serve(
    config: DeployConfig,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    orchestrator = config.security.apply(config.orchestrator)  # a bad TLS path fails before anything starts
    config = init_ray(config)  # blocking, but nothing else runs yet; Ray wants the main thread for it
    fleet = RayFleet(config)
    try:
        await asyncio.to_thread(fleet.launch)
        await serve_orchestrator(
            orchestrator, fleet, on_listening, stop, ready_timeout_s=config.ray.ready_timeout_s
        )
    finally:
        await fleet.close()
        ray.shutdown()
