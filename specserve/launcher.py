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

from specserve.flags import flags_for
from specserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now that this process has not handed out before: the server it is for binds it later,
    and a worker still starting has not bound the one handed out before."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _worker_command(role: str, model: ModelConfig, port: int) -> list[str]:
    """`python -m {role}_service` loading `model` on `port` (cli.worker_parser reads the flags back)."""
    return [sys.executable, "-m", f"{role}_service", *flags_for(model), "--port", str(port)]


def extra_draft_role(name: str) -> str:
    return f"draft:{name}"


class Workers(dict[str, str]):
    """Role -> address of the worker processes `worker_processes` started; their processes by role."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def raise_if_exited(self) -> None:
        """A worker that died while its callers wait for it (killed for memory while loading, say) is an
        error now, not a timeout minutes later."""
        for role, process in self.processes.items():
            code = process.poll()
            if code is not None:
                why = " (SIGKILL: out of memory?)" if code == -signal.SIGKILL else ""
                raise RuntimeError(f"the {role} service (pid {process.pid}) exited with code {code}{why}")


@contextmanager
def worker_processes(
    target: ModelConfig,
    draft: ModelConfig | None,
    worker_args: Sequence[str] = (),
    extra_drafts: Sequence[ModelConfig] = (),
) -> Iterator[Workers]:
    """Start the target (and draft) servers as child processes (with `worker_args` added to their command
    lines); stop them on exit, whatever happens. `extra_drafts`: more draft servers, known as
    `extra_draft_role(name)` (e.g. prompt lookup beside the model draft, over the same target)."""
    roles = [("target", target)] + ([("draft", draft)] if draft is not None else [])
    roles += [(extra_draft_role(model.name), model) for model in extra_drafts]
    workers = Workers()
    try:
        for role, model in roles:
            port = free_port()
            command = _worker_command(role.split(":")[0], model, port) + list(worker_args)
            workers.processes[role] = process = subprocess.Popen(command, env=dict(os.environ))
            workers[role] = f"127.0.0.1:{port}"
            logger.info("started %s service (pid %d) on %s", role, process.pid, workers[role])
        yield workers
    finally:
        processes = list(workers.processes.values())
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
