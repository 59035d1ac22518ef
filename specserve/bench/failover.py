"""`python -m specserve.bench.failover`: greedy streams through a served pair with two target replicas, one
replica killed mid-stream; every output is then compared with batch-1 target-only decoding, and each
departure is classified as the bench does for batching: a near-tie of the target's top two logits, or not."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from specserve.flags import add_config_flags, build_from_flags, flag
from specserve.launcher import Workers, free_port, worker_processes
from specserve.models.config import ModelConfig

if TYPE_CHECKING:
    from specserve.models.loading import LoadedModel

logger = logging.getLogger(__name__)

PROMPTS = (
    "def quicksort(items: list[int]) -> list[int]:\n",
    "class LRUCache:\n    def __init__(self, capacity: int) -> None:\n",
    "import numpy as np\n\n\ndef normalize(x):\n",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "# parse a CSV file and print the sum of each column\n",
    "async def fetch_all(urls):\n",
)


@dataclass(frozen=True, slots=True)
class FailoverConfig:
    target: ModelConfig
    draft: ModelConfig | None
    num_streams: int = 3
    """Concurrent greedy streams."""
    max_tokens: int = 160
    """Tokens each stream generates."""
    kill_after_tokens: int = 60
    """The replica is killed once every stream has this many tokens."""
    num_speculative_tokens: int | None = field(default=None, metadata=flag("-k", "--num-speculative-tokens"))
    """Fixed k; None: the server's default (adaptive k)."""
    ignore_eos: bool = True
    """Streams run to max_tokens, so the kill lands mid-stream."""

    def __post_init__(self) -> None:
        if self.num_streams < 1:
            raise ValueError(f"num_streams must be >= 1, got {self.num_streams}")
        if not 0 < self.kill_after_tokens < self.max_tokens:
            raise ValueError(f"kill_after_tokens must be in (0, max_tokens={self.max_tokens}), got "
                             f"{self.kill_after_tokens}")  # fmt: skip


@dataclass(slots=True)
class StreamResult:
    prompt: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    tokens_at_kill: int = 0
    departure: dict[str, object] | None = None
    """Where it first departs from batch-1 target-only: position, tokens, top2_margin, near_tie."""


@dataclass(slots=True)
class FailoverResult:
    killed: str = ""
    """The target replica killed (its address) and how many sessions it held then."""
    killed_sessions: int = 0
    streams: list[StreamResult] = field(default_factory=list)

    @property
    def num_real_departures(self) -> int:
        """Errors, and departures that are not near-ties (a lossless failover has none)."""
        return sum(bool(s.error) or (s.departure is not None and not s.departure["near_tie"]) for s in self.streams)


def run_failover(config: FailoverConfig) -> FailoverResult:
    """Serve, stream, kill, then (the workers stopped, their memory free) check against the target here."""
    with ExitStack() as stack:
        workers = [stack.enter_context(worker_processes(config.target, config.draft))]
        workers.append(stack.enter_context(worker_processes(config.target, None)))
        result = asyncio.run(_serve_and_stream(config, workers))
    _check_departures(config, result)
    return result


async def _serve_and_stream(config: FailoverConfig, workers: list[Workers]) -> FailoverResult:
    from orchestrator.replicas import StaticFleet
    from orchestrator.server import serve
    from orchestrator.service import OrchestratorConfig
    from protos import specserve_pb2 as pb
    from protos import specserve_pb2_grpc as pb_grpc
    from specserve_client import AsyncSpecServeClient

    targets = {w["target"]: w.processes["target"] for w in workers}
    fleet = StaticFleet({"target": list(targets), "draft": [w["draft"] for w in workers if "draft" in w]})
    orchestrator = OrchestratorConfig(port=free_port(), http_port=None, discovery_interval_s=0.5)
    stop, listening = asyncio.Event(), asyncio.get_running_loop().create_future()
    server = asyncio.ensure_future(serve(orchestrator, fleet, listening.set_result, stop))
    result = FailoverResult(streams=[StreamResult(PROMPTS[i % len(PROMPTS)]) for i in range(config.num_streams)])
    try:
        await asyncio.wait([listening, server], return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # it failed to start: say why
        async with AsyncSpecServeClient(f"127.0.0.1:{orchestrator.port}", timeout_s=1800) as client:
            admin = pb_grpc.AdminStub(client.channel)
            while True:  # both targets loaded before the streams start, so both get sessions
                for w in workers:
                    w.raise_if_exited()
                replicas = (await admin.ListReplicas(pb.ListReplicasRequest(), timeout=10)).replica_set.replicas
                if sum(r.role == "target" and r.state == "serving" for r in replicas) == len(targets):
                    break
                await asyncio.sleep(0.5)

            async def stream(s: StreamResult) -> None:
                try:
                    chunks = client.stream(s.prompt, max_tokens=config.max_tokens, ignore_eos=config.ignore_eos,
                                           num_speculative_tokens=config.num_speculative_tokens)  # fmt: skip
                    async for chunk in chunks:
                        s.token_ids.extend(chunk.token_ids)
                        s.finish_reason = chunk.finish_reason or s.finish_reason
                except Exception as error:  # noqa: BLE001 - reported in the table
                    s.error = f"{type(error).__name__}: {error}"

            tasks = [asyncio.ensure_future(stream(s)) for s in result.streams]
            streams = list(zip(result.streams, tasks))
            while not all(len(s.token_ids) >= config.kill_after_tokens or t.done() for s, t in streams):
                await asyncio.sleep(0.005)
            replicas = (await admin.ListReplicas(pb.ListReplicasRequest(), timeout=10)).replica_set.replicas
            busiest = max((r for r in replicas if r.role == "target"), key=lambda r: r.active_sessions)
            targets[busiest.address].send_signal(signal.SIGKILL)
            result.killed, result.killed_sessions = busiest.address, busiest.active_sessions
            for s in result.streams:
                s.tokens_at_kill = len(s.token_ids)
            logger.info("killed target replica %s (%d sessions) at %s tokens", busiest.address,
                        busiest.active_sessions, [s.tokens_at_kill for s in result.streams])  # fmt: skip
            await asyncio.gather(*tasks)
    finally:
        stop.set()
        await asyncio.gather(server, return_exceptions=True)
    return result


def _check_departures(config: FailoverConfig, result: FailoverResult) -> None:
    """Each output against target-only greedy decoding at batch 1 (bench/lossless.py, as --check-ties does)."""
    from specserve.bench.lossless import ReferenceDecoder, first_difference, first_divergence
    from specserve.models.loading import load_model

    target = load_model(config.target, progress=False)
    decoder = ReferenceDecoder(target)
    for s in result.streams:
        prompt_token_ids = _prompt_token_ids(target, s.prompt)
        greedy: list[int] = []
        for _ in range(len(s.token_ids)):
            greedy.append(int(decoder.logits(prompt_token_ids, greedy).argmax()))
        if first_difference(greedy, s.token_ids) is not None:
            divergence = first_divergence(decoder, prompt_token_ids, greedy, s.token_ids)
            assert divergence is not None
            s.departure = divergence.to_dict()


def _prompt_token_ids(target: LoadedModel, prompt: str) -> list[int]:
    """As the orchestrator tokenizes the request the streams send."""
    from specserve.config import GenerationRequest
    from specserve.prompts import tokenize_request

    return tokenize_request(target.tokenizer, GenerationRequest(prompt=prompt), target.max_context, target.vocab_size)


def format_table(config: FailoverConfig, result: FailoverResult) -> str:
    lines = [
        f"killed target replica {result.killed} ({result.killed_sessions} sessions) once every stream had "
        f"{config.kill_after_tokens} tokens; {config.target.name} ({config.target.dtype}) vs batch-1 target-only",
        f"{'stream':>6} {'tokens':>6} {'at kill':>7} {'finish':8} {'departs at':>10} {'top-2 margin':>12} verdict",
    ]
    for i, s in enumerate(result.streams):
        d = s.departure
        verdict = ("error: " + s.error[:80]) if s.error else "identical" if d is None else \
            "near-tie" if d["near_tie"] else "REAL DEPARTURE"  # fmt: skip
        position = "" if d is None else str(d["position"])
        margin = "" if d is None else f"{d['top2_margin']:.4g}"
        lines.append(f"{i:>6} {len(s.token_ids):>6} {s.tokens_at_kill:>7} {s.finish_reason:8} {position:>10} "
                     f"{margin:>12} {verdict}")  # fmt: skip
    identical = sum(s.departure is None and not s.error for s in result.streams)
    near_ties = len(result.streams) - identical - result.num_real_departures
    lines.append(f"{identical}/{len(result.streams)} identical, {near_ties} departed at near-ties, "
                 f"{result.num_real_departures} errors or real departures")  # fmt: skip
    return "\n".join(lines)


RUN_FLAGS = ("num_streams", "max_tokens", "kill_after_tokens", "num_speculative_tokens", "ignore_eos")


def build_parser() -> argparse.ArgumentParser:
    from specserve.cli import add_model_flags

    parser = argparse.ArgumentParser(prog="python -m specserve.bench.failover", description=__doc__)
    add_model_flags(parser, k=False)
    add_config_flags(parser.add_argument_group("run (FailoverConfig)"), FailoverConfig, only=RUN_FLAGS)
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    from specserve.cli import role_model
    from specserve.logs import configure_logging

    args = build_parser().parse_args(argv)
    configure_logging(logging.INFO)
    try:
        draft = None if args.draft.lower() == "none" else role_model(args, "draft", args.draft)
        kill_after = {} if args.max_tokens is None else {"kill_after_tokens": args.max_tokens * 3 // 8}
        config = build_from_flags(FailoverConfig, args, RUN_FLAGS, target=role_model(args, "target", args.target),
                                  draft=draft, **kill_after)  # fmt: skip
    except ValueError as error:
        print(f"specserve.bench.failover: error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    result = run_failover(config)
    print(format_table(config, result))
    print(f"({time.perf_counter() - started:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: str(v) for k, v in asdict(config).items()}, "killed": result.killed,
                       "killed_sessions": result.killed_sessions, "streams": [asdict(s) for s in result.streams],
                       "num_real_departures": result.num_real_departures}, f, indent=1)  # fmt: skip
    return 1 if result.num_real_departures else 0


if __name__ == "__main__":
    sys.exit(main())
