"""`specserve bench latency | load | rate`: their flags (derived from bench/config.py) and what each runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from specserve.bench.config import BenchConfig, OverheadConfig, SweepConfig
from specserve.config import EngineConfig
from specserve.flags import add_config_flags, build_from_flags

LOAD_FLAGS = ("concurrency", "requests_per_client", "duration_s", "warmup_s", "repeats", "peer_llama_cpp",
              "llama_cpp_draft_max")  # fmt: skip
RATE_FLAGS = ("request_rate", "num_requests")
SWEEP_FLAGS = tuple(f.name for f in dataclasses.fields(SweepConfig) if f.name not in LOAD_FLAGS + RATE_FLAGS)


def add_bench_commands(
    parser: argparse.ArgumentParser, add_model_flags: Callable[[argparse.ArgumentParser], None]
) -> None:
    """`specserve bench latency | load | rate`, each with the flags of what it measures (from BenchConfig and
    SweepConfig). `add_model_flags`: the target's and draft's flags the served sweeps load their models with."""
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="{latency,load,rate,overhead}")
    latency = sub.add_parser("latency", help="one request at a time: target-only, speculative and Hugging Face "
                             "assisted generation in this process; with --served, the served stack too")  # fmt: skip
    add_config_flags(latency, BenchConfig)
    for name, sweep_flags, text in (
        ("load", LOAD_FLAGS, "closed loop: clients sending back to back through the served stack, per concurrency"),
        ("rate", RATE_FLAGS, "open loop: Poisson arrivals through the served stack, per request rate"),
    ):
        command = sub.add_parser(name, help=text)
        add_model_flags(command)
        add_config_flags(command.add_argument_group("sweep (SweepConfig)"), SweepConfig,
                         only=sweep_flags + SWEEP_FLAGS, required=sweep_flags[:1])  # fmt: skip
    overhead = sub.add_parser("overhead", help="the served stack's host overhead per round: wall time less the "
                              "forward passes it waited for, at target-only and each k")  # fmt: skip
    add_model_flags(overhead)
    add_config_flags(overhead.add_argument_group("overhead (OverheadConfig)"), OverheadConfig)
    for command in sub.choices.values():
        command.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
        command.set_defaults(command_parser=command)


def cmd_bench(args: argparse.Namespace, engine_config: Callable[[argparse.Namespace], EngineConfig]) -> int:
    """`latency`: in process (target-only, speculative, the HF peer, optionally served); `load` / `rate`: a sweep
    of the served stack. `engine_config` reads the sweeps' model flags."""
    if args.bench_command == "latency":
        return _bench_latency(build_from_flags(BenchConfig, args), args.json)
    if args.bench_command == "overhead":
        return _bench_overhead(build_from_flags(OverheadConfig, args), engine_config(args), args.json)
    names = SWEEP_FLAGS + (LOAD_FLAGS if args.bench_command == "load" else RATE_FLAGS)
    return _bench_sweep(build_from_flags(SweepConfig, args, names), engine_config(args), args.json)


def _bench_latency(cfg: BenchConfig, json_path: str | None) -> int:
    from specserve.bench.report import format_table, machine
    from specserve.bench.runner import run_bench

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary = run_bench(cfg)
    summary["date"] = started
    summary["command"] = "specserve " + " ".join(sys.argv[1:])
    summary["machine"] = machine()
    print(format_table(summary))
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {json_path}")
    return 0


def _bench_overhead(cfg: OverheadConfig, config: EngineConfig, json_path: str | None) -> int:
    """Host overhead per round of the served stack (specserve/bench/overhead.py)."""
    from specserve.bench.config import PIPELINED
    from specserve.bench.overhead import format_rows, overhead_rows
    from specserve.bench.served import ServedStack

    if config.draft is None:
        raise ValueError("the overhead bench measures target-only and speculative rounds: it needs a draft")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with ServedStack(config.target, config.draft) as stack:  # target-only and each k, at each client count
        rows = overhead_rows(stack.addresses[PIPELINED], [0, *cfg.ks], cfg.concurrency, cfg.max_tokens,
                             cfg.requests_per_client, cfg.repeats)  # fmt: skip
    print(format_rows(rows))
    if json_path:
        _write_rows(json_path, started, rows)
    return 0


def _bench_sweep(sweep: SweepConfig, config: EngineConfig, json_path: str | None) -> int:
    """Closed-loop clients at each concurrency, or open-loop arrivals at each rate, against the served stack."""
    from specserve.bench.load import Compared, check_departures, rate_sweep
    from specserve.bench.load import sweep as closed_loop
    from specserve.bench.served import ServedStack
    from specserve.bench.workloads import workload
    from specserve.models.config import ModelConfig

    if config.draft is None:
        raise ValueError("the load sweep compares speculative modes with target-only: it needs a draft")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    workloads = {category: workload(category, sweep.num_prompts) for category in sweep.categories}
    compared: list[Compared] | None = [] if sweep.check_ties else None
    extra = [ModelConfig(name, quantization=config.draft.quantization) for name in sweep.drafts]
    peers = None
    if sweep.peer_llama_cpp is not None:
        from specserve.bench.llama_cpp_peer import load_peers

        peers = load_peers(sweep, config.target.name, config.draft.name)
    with ServedStack(config.target, config.draft, sweep.confidence_threshold, extra_drafts=extra) as stack:
        clients, rows = stack.load_clients, []
        if sweep.concurrency:
            rows += closed_loop(clients, workloads, list(sweep.concurrency), sweep.max_tokens,
                                sweep.requests_per_client, temperature=sweep.temperature, modes=sweep.modes,
                                repeats=sweep.repeats, duration_s=sweep.duration_s, warmup_s=sweep.warmup_s,
                                compared=compared, peers=peers)  # fmt: skip
        for category, prompts in workloads.items() if sweep.request_rate else ():
            rows += rate_sweep(clients, prompts, list(sweep.request_rate), sweep.max_tokens, sweep.num_requests,
                               temperature=sweep.temperature, category=category, modes=sweep.modes,
                               compared=compared)  # fmt: skip
    real_departures = 0
    if compared is not None:  # the workers have stopped: the target is loaded here alone
        from specserve.models.loading import load_model

        real_departures = check_departures(load_model(config.target), compared)
    if json_path:
        _write_rows(json_path, started, rows)
    if real_departures:
        print(f"NOT LOSSLESS: {real_departures} outputs departed from target-only away from a near-tie")
        return 1
    return 0


def _write_rows(json_path: str, started: str, rows: list[dict]) -> None:
    """A sweep's rows as JSON, with when, how and where they were measured."""
    from specserve.bench.report import machine

    summary = {"date": started, "command": "specserve " + " ".join(sys.argv[1:]), "machine": machine(), "rows": rows}
    Path(json_path).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {json_path}")
