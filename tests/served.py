"""`specserve serve` on a local Ray instance as a subprocess, in a session of its own: the driver and every
process Ray starts for it (GCS, raylet, the replicas' workers) are killed together, whatever the test did."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc


@contextlib.contextmanager
def local_serve(
    flags: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`specserve serve FLAGS`, its output in log_path. The caller may signal it; on exit, what is left of
    its process group is killed."""
    env = {k: v for k, v in (env or os.environ).items() if k != "RAY_ADDRESS"} | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "specserve.cli", "serve", *flags]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the driver if still there, and Ray's processes either way
        process.wait(10)


def wait_until_serving(port: int, process: subprocess.Popen[bytes], timeout_s: float = 240.0) -> None:
    """Until the orchestrator answers its admin API (every role's first replica has loaded)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        admin = pb_grpc.AdminStub(channel)
        while True:
            assert process.poll() is None, "specserve serve exited during start-up"
            try:
                admin.ListReplicas(pb.ListReplicasRequest(), timeout=2)
                return
            except grpc.RpcError:
                assert time.monotonic() < deadline, "specserve serve did not serve in time"
                time.sleep(0.3)
