"""specserve on a real multi-node Ray cluster on this machine: a head node and two worker node types,
`small_gpu` and `large_gpu` (custom resources standing in for GPU node types). Placement, correctness
through the orchestrator, scaling while streaming, and actor kills mid-stream."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve.launcher import free_port
from specserve_client import SpecServeClient
from tests.e2e.cluster import LoopbackCluster, wait_for_orchestrator

pytestmark = pytest.mark.e2e

PROMPTS = ["def add(a, b):", "import numpy as np\n", "# sort a list\n", "class Stack:", "while True:", "x = [i * i"]
MAX_TOKENS = 160  # long enough that kills and scaling land mid-stream (tiny models: ~100 ms per round here)

CONFIG = {
    "ray": {"worker_host": "node-ip", "ready_timeout_s": 300},
    "orchestrator": {"num_speculative_tokens": 4, "discovery_interval_s": 0.5, "failover_timeout_s": 90,
                     "drain_timeout_s": 30},
    "target": {"model": {"name": "tiny", "dtype": "float32", "device": "cpu"}, "num_cpus": 1,
               "resources": {"large_gpu": 1}, "cpu_threads": 1},
    "draft": {"model": {"name": "tiny-draft", "dtype": "float32", "device": "cpu"}, "num_cpus": 1,
              "resources": {"small_gpu": 1}, "cpu_threads": 1},
}  # fmt: skip


class Served:
    """The cluster, `specserve serve` on it, a client, and a Ray driver to look at (and kill) actors."""

    def __init__(self, cluster: LoopbackCluster, address: str) -> None:
        self.cluster, self.address = cluster, address
        self.client = SpecServeClient(address, timeout_s=300)
        self.channel = grpc.insecure_channel(address)
        self.admin = pb_grpc.AdminStub(self.channel)

    def replicas(self, role: str, state: str = "serving") -> list[pb.ReplicaInfo]:
        replica_set = self.admin.ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set
        return [r for r in replica_set.replicas if r.role == role and r.state == state]

    def wait_for(self, role: str, count: int, exclude: set[str] | None = None, timeout_s: float = 180.0) -> float:
        """Seconds until exactly `count` replicas of `role` serve, none of them at an excluded address."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            serving = self.replicas(role)
            if len(serving) == count and not (exclude or set()) & {r.address for r in serving}:
                return time.monotonic() - started
            time.sleep(0.2)
        raise TimeoutError(f"{role}: wanted {count} serving replicas, have {self.replicas(role)}")

    def actors(self, role: str) -> list[dict[str, Any]]:
        return [a for a in self.cluster.actors() if a["name"].startswith(f"specserve-{role}-")]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    node_types = {"small-gpu-node": {"small_gpu": 4}, "large-gpu-node": {"large_gpu": 4}}
    config_path = Path(tmp_path_factory.mktemp("deploy")) / "config.yaml"
    config_path.write_text(yaml.safe_dump(CONFIG))
    with LoopbackCluster(node_types, num_cpus_per_node=4) as cluster:
        port = free_port()
        process = cluster.start_specserve(config_path, port)
        try:
            wait_for_orchestrator(f"127.0.0.1:{port}", process)
            yield Served(cluster, f"127.0.0.1:{port}")
        finally:
            print(cluster.log("specserve")[-3000:])


@pytest.fixture(scope="module")
def references(engine: SpeculativeEngine) -> dict[str, list[int]]:
    """Target-only greedy output, in this process (fp32, batch 1: exact)."""
    return {
        p: engine.generate(
            GenerationRequest(prompt=p, max_tokens=MAX_TOKENS, num_speculative_tokens=0, ignore_eos=True)
        ).token_ids
        for p in PROMPTS
    }


class Load:
    """Clients streaming requests back to back until stopped; every outcome is kept."""

    def __init__(self, served: Served, num_clients: int = 3) -> None:
        self.served, self.stopped = served, threading.Event()
        self.results: list[tuple[str, list[int] | Exception, float, float]] = []  # (prompt, output, start, end)
        self.in_flight = threading.Semaphore(0)
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(num_clients)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(300)

    def _client(self, index: int) -> None:
        i = index
        while not self.stopped.is_set():
            prompt = PROMPTS[i % len(PROMPTS)]
            i += 1
            started = time.monotonic()
            token_ids: list[int] = []
            try:
                # a fixed k (adaptive k may switch the tiny draft off): every request uses the draft it may lose
                stream = self.served.client.stream(
                    prompt, max_tokens=MAX_TOKENS, ignore_eos=True, num_speculative_tokens=4
                )
                for chunk in stream:
                    if not token_ids:
                        self.in_flight.release()
                    token_ids.extend(chunk.token_ids)
                self.results.append((prompt, token_ids, started, time.monotonic()))
            except Exception as error:  # noqa: BLE001 - recorded; the test fails on it
                self.results.append((prompt, error, started, time.monotonic()))

    def wait_streaming(self, count: int = 2) -> None:
        for _ in range(count):
            assert self.in_flight.acquire(timeout=120), "no request started streaming"

    def check(self, references: dict[str, list[int]]) -> list[float]:
        """Every request answered, every answer equal to target-only; returns the latencies."""
        errors = [(p, r) for p, r, _, _ in self.results if isinstance(r, Exception)]
        assert not errors, errors
        wrong = [p for p, r, _, _ in self.results if r != references[p]]
        assert not wrong, f"{len(wrong)} of {len(self.results)} outputs differ from target-only: {wrong}"
        return [end - start for _, _, start, end in self.results]

    def cost_of(self, moment: float) -> str:
        """Latency of the requests in flight at `moment` against the median of the others."""
        hit = [end - start for _, _, start, end in self.results if start <= moment <= end]
        others = [end - start for _, _, start, end in self.results if not start <= moment <= end]
        return (
            f"{len(hit)} requests in flight took {statistics.mean(hit):.2f}s on average "
            f"(max {max(hit):.2f}s) vs a median of {statistics.median(others):.2f}s for the rest"
        )


def _kill(actor: dict[str, Any]) -> None:
    os.kill(actor["pid"], signal.SIGKILL)


def test_replicas_land_on_their_node_type_and_answer_correctly(served: Served, references: dict) -> None:
    for role, resource, other in (("draft", "small_gpu", "large_gpu"), ("target", "large_gpu", "small_gpu")):
        actors = served.actors(role)
        assert actors, f"no {role} actors"
        for actor in actors:
            assert resource in actor["node_resources"] and other not in actor["node_resources"], (role, actor)
            assert actor["resources"].get(resource) == 1.0
    for prompt in PROMPTS[:3]:
        response = served.client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True, num_speculative_tokens=4)
        assert list(response.token_ids) == references[prompt]
        assert response.stats.proposed > 0  # speculation ran through both services


def test_scaling_targets_up_and_down_while_streaming(served: Served, references: dict) -> None:
    with Load(served) as load:
        load.wait_streaming()
        response = served.admin.Scale(pb.ScaleRequest(target_replicas=2), timeout=120)
        assert response.replica_set.desired_target_replicas == 2
        served.wait_for("target", 2)
        load.wait_streaming(3)  # requests have run with two replicas
        served.admin.Scale(pb.ScaleRequest(target_replicas=1), timeout=120)
        assert len(served.replicas("target")) == 1
        load.wait_streaming(3)
    latencies = load.check(references)
    assert len(latencies) >= 6
    assert all("large_gpu" in a["node_resources"] for a in served.actors("target"))


def test_killing_a_draft_then_a_target_mid_stream_costs_no_answer(served: Served, references: dict) -> None:
    served.admin.Scale(pb.ScaleRequest(target_replicas=2), timeout=120)
    served.wait_for("target", 2)
    timings: dict[str, float] = {}
    with Load(served, num_clients=3) as load:
        load.wait_streaming(3)
        draft = served.actors("draft")[0]
        _kill(draft)
        draft_killed = time.monotonic()
        timings["draft_rejoin_s"] = served.wait_for("draft", 1, exclude={draft["address"]})
        load.wait_streaming(3)
        target = served.actors("target")[0]
        _kill(target)
        target_killed = time.monotonic()
        timings["target_rejoin_s"] = served.wait_for("target", 2, exclude={target["address"]})
        load.wait_streaming(3)
    latencies = load.check(references)
    print(f"\nfailover over {len(latencies)} requests: {timings}")
    print(f"draft killed: {load.cost_of(draft_killed)}\ntarget killed: {load.cost_of(target_killed)}")
    served.admin.Scale(pb.ScaleRequest(target_replicas=1), timeout=120)


def test_the_only_target_dying_makes_requests_wait_for_its_restart(served: Served, references: dict) -> None:
    served.wait_for("target", 1)
    with Load(served, num_clients=2) as load:
        load.wait_streaming(2)
        target = served.actors("target")[0]
        _kill(target)
        killed = time.monotonic()
        restart_s = served.wait_for("target", 1, exclude={target["address"]})
        load.wait_streaming(2)
    load.check(references)
    print(f"\nthe only target killed: back in {restart_s:.1f}s; {load.cost_of(killed)}")
