"""`specserve serve` on one machine: draft and target as local processes, the orchestrator here.
(The Ray builder in deploy/ places the same servers in actors on a cluster.)"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from specserve.models.loading import ModelConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalStackConfig:
    target: ModelConfig
    draft: ModelConfig | None
    num_speculative_tokens: int = 4
    host: str = "127.0.0.1"
    port: int = 50051
    pipelined: bool = True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _worker_command(role: str, model: ModelConfig, port: int) -> list[str]:
    command = [sys.executable, "-m", f"{role}_service", "--model", model.name, "--port", str(port)]
    command += ["--dtype", model.dtype, "--device", model.device, "--quantization", model.quantization]
    return command + (["--trust-remote-code"] if model.trust_remote_code else [])


@contextmanager
def worker_processes(config: LocalStackConfig) -> Iterator[dict[str, str]]:
    """Start the target (and draft) servers as child processes; stop them on exit, whatever happens."""
    roles = [("target", config.target)] + ([("draft", config.draft)] if config.draft is not None else [])
    processes: list[subprocess.Popen[bytes]] = []
    addresses = {}
    try:
        for role, model in roles:
            port = free_port()
            processes.append(subprocess.Popen(_worker_command(role, model, port), env=dict(os.environ)))
            addresses[role] = f"127.0.0.1:{port}"
            logger.info("started %s service (pid %d) on %s", role, processes[-1].pid, addresses[role])
        yield addresses
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


async def serve_local(
    config: LocalStackConfig, on_listening: Callable[[str], None] | None = None, stop: asyncio.Event | None = None
) -> None:
    from orchestrator.server import serve
    from orchestrator.service import OrchestratorConfig

    with worker_processes(config) as addresses:
        orchestrator = OrchestratorConfig(
            target_address=addresses["target"],
            draft_address=addresses.get("draft"),
            num_speculative_tokens=config.num_speculative_tokens if config.draft else 0,
            pipelined=config.pipelined,
            host=config.host,
            port=config.port,
        )
        await serve(orchestrator, on_listening, stop)
