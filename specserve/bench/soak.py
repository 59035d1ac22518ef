"""`python -m specserve.bench.soak`: a served stack of child processes (target, draft, orchestrator) on
loopback under closed-loop streaming clients for a bounded number of requests and seconds. Checks zero
errors, every output equal to its target-only reference, each process's RSS flat after warm-up, no sessions
left on any worker at the end; reports latency p50/p99. Exit status 1 when a check fails."""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.bench.load import _percentile
from specserve.config import GenerationRequest
from specserve.flags import NO_FLAG, add_config_flags, build_from_flags, flag
from specserve.launcher import free_port, worker_processes
from specserve.models.loading import ModelConfig, load_model
from specserve_client import SpecServeClient

PROMPTS = [
    "def add(a, b):", "import os\n", "class Tree:", "# parse the line\n", "for i in range(10):", "SELECT * FROM",
    "fn main() {", "x = [1, 2, 3]\n", "The quick brown fox", "async def fetch(url):", "#include <stdio.h>\n",
    "def fib(n):\n    ", "while True:", "return {", "try:\n    ", "# TODO: ",
]  # fmt: skip
MAX_TOKENS = (16, 32, 48, 64)  # request lengths cycle through these
MAX_RETRIES = 200  # per request, on RESOURCE_EXHAUSTED (each after the server's retry hint)
# "Flat": growth after warm-up within 5% or 16 MiB (allocator noise); a leak per request grows without end.
RSS_GROWTH_LIMIT = 0.05
RSS_GROWTH_FLOOR_MIB = 16.0


@dataclass
class SoakConfig:
    target: str = "tiny"
    """The target: a preset, a Hugging Face model id or a directory."""
    draft: str | None = "tiny-draft"
    """The draft, likewise; None (`--draft none`): target-only."""
    clients: int = 32
    """Concurrent streaming clients."""
    requests: int = 1000
    """Requests in total, over all clients."""
    time_limit_s: float = 1800.0
    """Clients stop taking new requests after this; the run then counts as incomplete."""
    k: int | None = field(default=None, metadata=flag("-k", "--num-speculative-tokens", metavar="K"))
    """Fixed k for every request; None: the server's adaptive k."""
    warmup_fraction: float = 0.2
    """RSS is compared from when this fraction of the requests has completed to the end."""
    orchestrator_flags: list[str] = field(default_factory=list, metadata=NO_FLAG)
    """Extra `python -m orchestrator` flags, e.g. ["--max-concurrent-requests", "8"]."""

    def __post_init__(self) -> None:
        if self.clients < 1 or self.requests < 1:
            raise ValueError(f"clients and requests must be >= 1, got {self.clients} and {self.requests}")


@dataclass
class SoakResult:
    config: dict
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    identical: int = 0
    mismatches: list[dict] = field(default_factory=list)
    refusals: int = 0
    """RESOURCE_EXHAUSTED answers (backpressure), each retried after its hint."""
    seconds: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    ttft_p50_s: float = 0.0
    tokens: int = 0
    rss_mib: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per process: start (before load), warm (after warm-up), peak, end."""
    peak_sessions: dict[str, int] = field(default_factory=dict)
    """Most sessions (KV caches) each worker held at once, sampled with the RSS."""
    sessions_left: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def run_soak(config: SoakConfig) -> SoakResult:
    result = SoakResult(asdict(config))
    references = _references(config)
    with served_stack(config) as (address, pids, workers):
        sampler = RssSampler(pids, workers)
        sampler.start()
        latencies, ttfts = _drive(config, address, references, result, sampler)
        sampler.stop()
        result.sessions_left = _sessions_left(workers, address)
    result.latency_p50_s, result.latency_p99_s = _percentile(latencies, 50), _percentile(latencies, 99)
    result.ttft_p50_s = _percentile(ttfts, 50)
    result.rss_mib = sampler.summary(config.warmup_fraction * config.requests)
    result.peak_sessions = sampler.peak_sessions
    _judge(config, result)
    return result


def _references(config: SoakConfig) -> dict[tuple[str, int], list[int]]:
    """Target-only greedy output of every (prompt, max_tokens) the clients send, in this process."""
    from inprocess.engine import SpeculativeEngine

    engine = SpeculativeEngine(load_model(ModelConfig(config.target, device="cpu", dtype="float32")), None, 0)
    return {
        (prompt, max_tokens): engine.generate(
            GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True)
        ).token_ids
        for prompt in PROMPTS
        for max_tokens in MAX_TOKENS
    }


@contextmanager
def served_stack(config: SoakConfig) -> Iterator[tuple[str, dict[str, int], dict[str, str]]]:
    """(orchestrator address, pid per process, worker addresses): every process stopped on exit."""
    target = ModelConfig(config.target, device="cpu", dtype="float32")
    draft = ModelConfig(config.draft, device="cpu", dtype="float32") if config.draft else None
    with worker_processes(target, draft) as workers:
        port = free_port()
        command = [sys.executable, "-m", "orchestrator", "--port", str(port), "--target", workers["target"]]
        command += ["--draft", workers["draft"]] if "draft" in workers else []
        orchestrator = subprocess.Popen(command + config.orchestrator_flags, stderr=subprocess.DEVNULL)
        try:
            address = f"127.0.0.1:{port}"
            _wait_until_serving(address, orchestrator)
            pids = {role: process.pid for role, process in workers.processes.items()}
            yield address, pids | {"orchestrator": orchestrator.pid}, workers
        finally:
            orchestrator.terminate()
            try:
                orchestrator.wait(30)
            except subprocess.TimeoutExpired:
                orchestrator.kill()


def _wait_until_serving(address: str, process: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    with SpecServeClient(address) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the orchestrator exited with {process.returncode} during start-up")
            try:
                client.info()
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


class RssSampler:
    """VmRSS of each process every `every_s`, tagged with how many requests had completed; and the most
    sessions each worker held."""

    def __init__(self, pids: dict[str, int], workers: dict[str, str], every_s: float = 0.5) -> None:
        self.pids, self.workers, self.every_s = pids, workers, every_s
        self.completed = 0
        self.peak_sessions = dict.fromkeys(workers, 0)
        self.samples: list[tuple[int, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        self.samples.append((self.completed, {role: _rss_mib(pid) for role, pid in self.pids.items()}))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()
            for role, address in self.workers.items():
                self.peak_sessions[role] = max(self.peak_sessions[role], _worker_sessions(role, address))

    def summary(self, warm_after: float) -> dict[str, dict[str, float]]:
        warm = next((s for done, s in self.samples if done >= warm_after), self.samples[-1])
        return {
            role: {
                "start": self.samples[0][1][role],
                "warm": warm[role],
                "peak": max(s[role] for _, s in self.samples),
                "end": self.samples[-1][1][role],
            }
            for role in self.pids
        }


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _drive(
    config: SoakConfig,
    address: str,
    references: dict[tuple[str, int], list[int]],
    result: SoakResult,
    sampler: RssSampler,
) -> tuple[list[float], list[float]]:
    """Closed loop: each client takes the next request number until `requests` are taken or time is up."""
    numbers = itertools.count()
    lock = threading.Lock()
    latencies: list[float] = []
    ttfts: list[float] = []
    deadline = time.monotonic() + config.time_limit_s

    def client_loop() -> None:
        with SpecServeClient(address, timeout_s=300) as client:
            while time.monotonic() < deadline:
                with lock:
                    number = next(numbers)
                if number >= config.requests:
                    return
                prompt, max_tokens = (
                    PROMPTS[number % len(PROMPTS)],
                    MAX_TOKENS[number // len(PROMPTS) % len(MAX_TOKENS)],
                )
                outcome = _one_request(client, prompt, max_tokens, config.k)
                with lock:
                    result.requests += 1
                    result.refusals += outcome.refusals
                    sampler.completed += 1
                    if outcome.error is not None:
                        result.errors.append(outcome.error)
                        continue
                    latencies.append(outcome.latency_s)
                    ttfts.append(outcome.ttft_s)
                    result.tokens += len(outcome.token_ids)
                    if outcome.token_ids == references[prompt, max_tokens]:
                        result.identical += 1
                    else:
                        result.mismatches.append(
                            {"prompt": prompt, "max_tokens": max_tokens, "output": outcome.token_ids}
                        )

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop, name=f"client-{i}") for i in range(config.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.perf_counter() - started
    return latencies, ttfts


@dataclass
class _Outcome:
    token_ids: list[int] = field(default_factory=list)
    latency_s: float = 0.0
    ttft_s: float = 0.0
    refusals: int = 0
    error: str | None = None


def _one_request(client: SpecServeClient, prompt: str, max_tokens: int, k: int | None) -> _Outcome:
    """One streamed request; RESOURCE_EXHAUSTED is retried after the server's `retry-after-ms`."""
    outcome = _Outcome()
    started = time.perf_counter()
    for _ in range(MAX_RETRIES):
        outcome.token_ids, first = [], None
        try:
            for chunk in client.stream(prompt, max_tokens=max_tokens, ignore_eos=True, num_speculative_tokens=k):
                if chunk.token_ids and first is None:
                    first = time.perf_counter()
                outcome.token_ids.extend(chunk.token_ids)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # type: ignore[attr-defined]
                outcome.error = f"{error.code().name}: {error.details()}"  # type: ignore[attr-defined]
                return outcome
            outcome.refusals += 1
            hint = dict(error.trailing_metadata() or ()).get("retry-after-ms")  # type: ignore[attr-defined]
            time.sleep((int(hint) / 1000 if hint else 0.1) * (1 + random.random()))  # jitter: no thundering herd
            continue
        outcome.latency_s = time.perf_counter() - started  # from the first attempt: queueing and retries count
        outcome.ttft_s = (first or time.perf_counter()) - started
        return outcome
    outcome.error = f"RESOURCE_EXHAUSTED {MAX_RETRIES} times"
    return outcome


def _sessions_left(workers: dict[str, str], address: str, settle_s: float = 2.0) -> dict[str, int]:
    """Sessions each worker (and the orchestrator's replica view) still holds once every client is done."""
    deadline = time.monotonic() + settle_s
    while True:
        left = {role: _worker_sessions(role, worker) for role, worker in workers.items()}
        with grpc.insecure_channel(address) as channel:
            replicas = pb_grpc.AdminStub(channel).ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set
        left["orchestrator"] = sum(r.active_sessions for r in replicas.replicas)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _worker_sessions(role: str, address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.TargetServiceStub(channel) if role == "target" else pb_grpc.DraftServiceStub(channel)
        return stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10).num_sessions


def _judge(config: SoakConfig, result: SoakResult) -> None:
    failures = result.failures
    if result.requests < config.requests:
        failures.append(f"only {result.requests}/{config.requests} requests ran within {config.time_limit_s:g}s")
    if result.errors:
        failures.append(f"{len(result.errors)} errors, e.g. {result.errors[0]}")
    if result.mismatches:
        failures.append(f"{len(result.mismatches)} outputs differ from target-only")
    if any(result.sessions_left.values()):
        failures.append(f"sessions left behind: {result.sessions_left}")
    for role, rss in result.rss_mib.items():
        growth = rss["end"] - rss["warm"]
        if growth > max(RSS_GROWTH_FLOOR_MIB, RSS_GROWTH_LIMIT * rss["warm"]):
            failures.append(f"{role} RSS grew {growth:.1f} MiB after warm-up ({rss['warm']:.0f} -> {rss['end']:.0f})")


def format_result(result: SoakResult) -> str:
    lines = [
        f"requests {result.requests} in {result.seconds:.1f}s ({result.requests / max(result.seconds, 1e-9):.1f}/s, "
        f"{result.tokens / max(result.seconds, 1e-9):.0f} tok/s), errors {len(result.errors)}, "
        f"identical to target-only {result.identical}/{result.requests - len(result.errors)}, "
        f"refused-then-retried {result.refusals}",
        f"latency p50 {result.latency_p50_s:.3f}s p99 {result.latency_p99_s:.3f}s, first token p50 "
        f"{1000 * result.ttft_p50_s:.0f} ms",
    ]
    for role, rss in result.rss_mib.items():
        lines.append(
            f"{role:12} RSS MiB: start {rss['start']:.1f}  after warm-up {rss['warm']:.1f}  peak {rss['peak']:.1f}"
            f"  end {rss['end']:.1f}  (growth after warm-up {rss['end'] - rss['warm']:+.1f})"
        )
    lines.append(f"most sessions held at once: {result.peak_sessions}; sessions left: {result.sessions_left}")
    lines.append("PASS" if result.passed else "FAIL: " + "; ".join(result.failures))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.soak", description=__doc__,
                                     epilog="Other flags go to `python -m orchestrator`.")  # fmt: skip
    add_config_flags(parser, SoakConfig)
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args, orchestrator_flags = parser.parse_known_args(argv)  # the rest goes to `python -m orchestrator`
    base: dict[str, object] = {"orchestrator_flags": orchestrator_flags}
    if args.draft is not None and args.draft.lower() == "none":
        args.draft, base["draft"] = None, None  # target-only
    try:
        config = build_from_flags(SoakConfig, args, **base)
    except ValueError as error:
        parser.error(str(error))
    result = run_soak(config)
    print(format_result(result), flush=True)
    if args.json:
        summary = asdict(result) | {
            "passed": result.passed,
            "command": " ".join(["python -m specserve.bench.soak", *(argv or sys.argv[1:])]),
        }
        summary["mismatches"] = summary["mismatches"][:10]
        summary["errors"] = summary["errors"][:10]
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
