"""A real multi-node Ray cluster on this machine, started with `ray start` (a head plus worker nodes with
custom resources standing in for GPU node types), and `specserve serve` joined to it as a subprocess.
Every process is started in its own process group and killed with it, even when a test fails."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.launcher import free_port

RAY = str(Path(sys.executable).with_name("ray"))


class LoopbackCluster:
    def __init__(self, node_types: Mapping[str, Mapping[str, float]], num_cpus_per_node: int = 2) -> None:
        self.node_types, self.num_cpus_per_node = node_types, num_cpus_per_node
        self.temp_dir = tempfile.mkdtemp(prefix="ssray-", dir="/tmp")  # short: Ray's socket paths have a limit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # the test cluster has its own token: token authentication stays on, as in production
        self.env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        self.env.pop("RAY_ADDRESS", None)
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> LoopbackCluster:
        try:
            self._start_node("head", ["--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false"])
            self._wait_for_nodes(1)
            for i, (name, resources) in enumerate(self.node_types.items()):
                flags = [f"--address={self.address}", f"--num-cpus={self.num_cpus_per_node}"]
                self._start_node(name, [*flags, f"--resources={json.dumps(dict(resources))}"])
                self._wait_for_nodes(i + 2)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_node(self, name: str, flags: list[str]) -> None:
        log = open(Path(self.temp_dir) / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        command = [RAY, "start", "--block", "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
                   "--node-ip-address=127.0.0.1", "--object-store-memory=100000000", *flags]  # fmt: skip
        self.processes.append(
            subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def _wait_for_nodes(self, count: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.num_nodes() >= count:
                return
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"a Ray node exited during start-up; logs in {self.temp_dir}")
            time.sleep(1.0)
        raise TimeoutError(f"{count} Ray nodes did not join within {timeout_s:.0f}s; logs in {self.temp_dir}")

    def num_nodes(self) -> int:
        status = subprocess.run(
            [RAY, "status", f"--address={self.address}"], env=self.env, capture_output=True, text=True, timeout=60
        )
        return status.stdout.count(" node_")

    def start_specserve(self, config_path: Path, port: int) -> subprocess.Popen[bytes]:
        """`specserve serve` joined to this cluster, as a user would run it on the head node."""
        log = open(Path(self.temp_dir) / "specserve.log", "wb")  # noqa: SIM115
        command = [sys.executable, "-m", "specserve.cli", "-v", "serve", "--config", str(config_path),
                   "--address", self.address, "--port", str(port), "--http-port", "0"]  # fmt: skip
        process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def actors(self) -> list[dict[str, Any]]:
        """Every specserve replica actor: name, node id, the node's resources, pid, address. Asked by a
        separate Ray driver process, so this one never holds Ray state between tests."""
        probe = subprocess.run(
            [sys.executable, "-c", "from tests.e2e.cluster import print_actors; print_actors()", self.address],
            env=self.env, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
        )  # fmt: skip
        if probe.returncode != 0:
            raise RuntimeError(f"actor probe failed: {probe.stderr[-3000:]}")
        return list(json.loads(probe.stdout.strip().splitlines()[-1]))

    def log(self, name: str) -> str:
        return (Path(self.temp_dir) / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for process in reversed(self.processes):  # specserve first, then the workers, the head last
            _kill_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes:  # whatever ignored SIGTERM (raylets, workers, agents)
            _kill_group(process, signal.SIGKILL)
            process.wait(timeout=15)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def print_actors() -> None:
    import ray

    ray.init(address=sys.argv[1], namespace="specserve", log_to_driver=False, logging_level="ERROR")
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    found = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == "specserve" and actor["name"].startswith("specserve-"):
            try:
                where = ray.get(ray.get_actor(actor["name"]).where.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - being stopped or restarted: not listed
                continue
            found.append(where | {"name": actor["name"], "node_resources": nodes.get(where["node_id"], {})})
    print(json.dumps(found))


def wait_for_orchestrator(address: str, process: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        admin = pb_grpc.AdminStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError("specserve serve exited during start-up")
            try:
                admin.ListReplicas(pb.ListReplicasRequest(), timeout=2)
                return
            except grpc.RpcError:
                time.sleep(0.5)
    raise TimeoutError(f"the orchestrator did not answer within {timeout_s:.0f}s")
