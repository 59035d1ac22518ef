"""The launcher's worker processes and ports: a worker that dies while its callers wait for it is reported
at once, with its exit code, rather than found by a timeout minutes later (a target killed for memory
while loading); no two servers share a port (a server started before another bound "its" free port used
to share it, and calls for one reached the other)."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from specserve.launcher import Workers, free_port, worker_processes
from specserve.models.loading import ModelConfig
from specserve.rpc import Server


def _wait_for_exit(workers: Workers, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers.raise_if_exited()
        time.sleep(0.2)


def test_a_worker_that_fails_to_load_is_reported_with_its_exit_code() -> None:
    with worker_processes(ModelConfig("no-such-model-here", device="cpu"), None) as workers:
        with pytest.raises(RuntimeError, match=r"the target service \(pid \d+\) exited with code [1-9]"):
            _wait_for_exit(workers)


def test_a_killed_worker_is_reported_as_likely_out_of_memory() -> None:
    draft = ModelConfig("tiny-draft", device="cpu", dtype="float32")
    with worker_processes(ModelConfig("tiny", device="cpu", dtype="float32"), draft) as workers:
        workers.raise_if_exited()  # both alive
        workers.processes["draft"].send_signal(signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"the draft service .* code -9 \(SIGKILL: out of memory\?\)"):
            _wait_for_exit(workers)


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [free_port() for _ in range(1000)]  # the kernel hands a just-released port out again
    assert len(set(ports)) == len(ports)


def test_a_server_binding_a_taken_port_fails_instead_of_sharing_it() -> None:
    async def bind_twice() -> None:
        first = Server(["specserve.v1.TargetService"])
        first.bind("127.0.0.1", 0)
        await first.start()
        try:
            with pytest.raises(RuntimeError, match="Failed to bind"):
                Server(["specserve.v1.DraftService"]).bind("127.0.0.1", first.port)
        finally:
            await first.stop(0)

    asyncio.run(bind_twice())
