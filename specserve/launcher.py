"""Draft and target services as child processes of this one, on loopback: the benchmark's served stack.
(`specserve serve` places the same servers in Ray actors: deploy/.)"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from specserve.models.loading import ModelConfig

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _worker_command(role: str, model: ModelConfig, port: int) -> list[str]:
    command = [sys.executable, "-m", f"{role}_service", "--model", model.name, "--port", str(port)]
    command += ["--dtype", model.dtype, "--device", model.device, "--quantization", model.quantization]
    command += ["--trust-remote-code"] if model.trust_remote_code else []
    command += [] if model.few_query_attention else ["--no-few-query-attention"]
    return command + ([] if model.pack_weights else ["--no-pack-weights"])


@contextmanager
def worker_processes(
    target: ModelConfig, draft: ModelConfig | None, worker_args: Sequence[str] = ()
) -> Iterator[dict[str, str]]:
    """Start the target (and draft) servers as child processes (with `worker_args` added to their command
    lines); stop them on exit, whatever happens."""
    roles = [("target", target)] + ([("draft", draft)] if draft is not None else [])
    processes: list[subprocess.Popen[bytes]] = []
    addresses = {}
    try:
        for role, model in roles:
            port = free_port()
            command = _worker_command(role, model, port) + list(worker_args)
            processes.append(subprocess.Popen(command, env=dict(os.environ)))
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
