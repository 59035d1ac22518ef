"""`specserve bench`: its flags and what it runs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specserve.bench.load import DEFAULT_MODES
from specserve.bench.served import SERVED_MODE_SUFFIXES
from specserve.config import EngineConfig
from specserve.models.config import DTYPE_NAMES


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-prompts", type=int, default=10, help="prompts per mode (per category under load)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8], help="in process: the k of each "
                        "speculative mode (default: 2 4 6 8)")  # fmt: skip
    parser.add_argument("--no-fp32-draft", action="store_true", help="skip the modes with a float32 draft")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face assisted-generation peer")
    parser.add_argument(
        "--no-hf-plain",
        action="store_true",
        help="skip the peer on a target as transformers ships it (no prepacked weights, SDPA attention)",
    )
    parser.add_argument(
        "--baseline-dtypes", nargs="+", default=["float32", "bfloat16"], choices=sorted(DTYPE_NAMES),
        help="in process: target-only in each of these dtypes; speedups are against the fastest",
    )  # fmt: skip
    parser.add_argument("--served", action="store_true", help="also measure the served stack over gRPC")
    parser.add_argument(
        "--no-in-process", action="store_true", help="with --served or --address: skip specserve's in-process "
        "modes; the target here is loaded only as transformers ships it, for the peer (one copy of the target fewer)",
    )  # fmt: skip
    parser.add_argument("--address", help="also measure a running orchestrator at HOST:PORT (same models)")
    parser.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help="instead: closed-loop clients at these concurrencies (served)"
    )
    parser.add_argument("--requests-per-client", type=int, default=2, help="with --concurrency: requests each client "
                        "sends per mode")  # fmt: skip
    parser.add_argument(
        "--duration", type=float, metavar="SECONDS", help="with --concurrency: instead of --requests-per-client, "
        "clients send requests until the end of a timed window and throughput counts the tokens of that window",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", type=float, default=0.0, metavar="SECONDS",
        help="with --duration: the window opens this long after every client's first token (first prompts prefilled)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=int, default=1, help="with --concurrency: the modes take turns this many times per load "
        "(spreads the drift of a shared machine over all modes)",
    )  # fmt: skip
    parser.add_argument("--temperature", type=float, default=0.0, help="with --concurrency: 0 = greedy")
    parser.add_argument(
        "--request-rate", type=float, nargs="+", help="instead: open-loop Poisson arrivals at these rates (req/s)"
    )
    parser.add_argument("--num-requests", type=int, default=16, help="with --request-rate: requests per mode")
    parser.add_argument(
        "--categories", "--category", nargs="+", default=["code"], help="the workloads: code (HumanEval), chat, "
        "summarisation, translation, 'question answering', maths, edit (code to edit: answers repeat the prompt), "
        "long-N (specserve/bench/workloads.py)",
    )  # fmt: skip
    parser.add_argument(
        "--served-variants", nargs="+", choices=list(SERVED_MODE_SUFFIXES), metavar="VARIANT",
        help="with --served: run only these variants of the 'served k=N' modes (default: all of "
        f"{', '.join(repr(v) for v in SERVED_MODE_SUFFIXES)})",
    )  # fmt: skip
    parser.add_argument(
        "--drafts", nargs="+", default=[], metavar="DRAFT", help="with --served: also measure these draft services "
        "over the same target worker, at adaptive k and each of --ks, e.g. ngram (prompt lookup) or "
        "qwen2.5-coder-0.5b+ngram (the hybrid); outputs checked against target-only's. With --concurrency: "
        "start them, for modes such as adaptive@ngram",
    )  # fmt: skip
    parser.add_argument(
        "--modes", nargs="+", default=list(DEFAULT_MODES), help="with --concurrency/--request-rate: "
        "target-only, k=N, adaptive, and k=N+stop / adaptive+stop (the draft ends windows on low confidence), "
        "k=N@DRAFT / adaptive@DRAFT (over a draft of --drafts); "
        "a mode with a label, e.g. target-only#2, runs again in turns of its own (its ratio to the mode: the noise)",
    )  # fmt: skip
    parser.add_argument(
        "--confidence-threshold", type=float, default=0.3,
        help="the draft's early stop in the '+stop' modes and with --early-stop",
    )  # fmt: skip
    parser.add_argument(
        "--early-stop", action="store_true", help="in process: also run each k with the draft's early stop at "
        "--confidence-threshold (HF's default schedule: 0.4)",
    )  # fmt: skip
    parser.add_argument(
        "--overhead", action="store_true", help="instead: the served stack's host overhead per round (wall time "
        "less the forward passes it waited for) at target-only and each of --ks, at --concurrency clients "
        "(default: 1 16), --requests-per-client each, --repeats turns",
    )  # fmt: skip
    parser.add_argument(
        "--check-ties", action="store_true", help="with --concurrency/--request-rate, greedy: afterwards, load the "
        "target here and check that every output departing from target-only's does so at a near-tie of the "
        "target's top two logits (exit status 1 if one does not)",
    )  # fmt: skip


def cmd_bench(args: argparse.Namespace, config: EngineConfig) -> int:
    """In process (target-only, speculative, the HF peer, optionally served), or a load sweep."""
    from specserve.bench.report import format_table, machine
    from specserve.bench.runner import BenchConfig, run_bench

    if args.overhead:
        return _bench_overhead(args, config)
    if args.concurrency or args.request_rate:
        return _bench_load(args, config)

    cfg = BenchConfig(
        target=args.target, draft=args.draft, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
        ks=tuple(args.ks), target_dtype=args.target_dtype, draft_quantization=args.draft_quantization,
        baseline_dtypes=tuple(args.baseline_dtypes), hf=not args.no_hf, hf_plain_target=not args.no_hf_plain,
        hf_fp32_draft=not args.no_fp32_draft, in_process=not args.no_in_process,
        served=args.served, address=args.address, stop_threshold=args.confidence_threshold if args.early_stop else 0.0,
        categories=tuple(args.categories), extra_drafts=tuple(args.drafts),
        served_variants=tuple(args.served_variants) if args.served_variants else None,
    )  # fmt: skip
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary = run_bench(cfg)
    summary["date"] = started
    summary["command"] = "specserve " + " ".join(sys.argv[1:])
    summary["machine"] = machine()
    print(format_table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _bench_overhead(args: argparse.Namespace, config: EngineConfig) -> int:
    """Host overhead per round of the served stack (specserve/bench/overhead.py)."""
    from specserve.bench.overhead import format_rows, run_overhead_bench
    from specserve.bench.report import machine

    if config.draft is None:
        raise ValueError("--overhead measures target-only and speculative rounds: it needs a draft")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    concurrency = args.concurrency or [1, 16]
    rows = run_overhead_bench(
        config.target, config.draft, args.ks, concurrency, args.max_tokens, args.requests_per_client, args.repeats
    )
    print(format_rows(rows))
    if args.json:
        command = "specserve " + " ".join(sys.argv[1:])
        summary = {"date": started, "command": command, "machine": machine(), "rows": rows}
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _bench_load(args: argparse.Namespace, config: EngineConfig) -> int:
    """Closed-loop clients at each concurrency, or open-loop arrivals at each rate, against the served stack:
    target-only, k=4, adaptive."""
    from specserve.bench.load import Compared, check_departures, parse_mode, rate_sweep, sweep
    from specserve.bench.report import machine
    from specserve.bench.served import ServedStack
    from specserve.bench.workloads import workload
    from specserve.models.config import ModelConfig

    if config.draft is None:
        raise ValueError("the load sweep compares speculative modes with target-only: it needs a draft")
    if args.repeats < 1 or (args.duration is not None and args.duration <= 0) or args.warmup < 0:
        raise ValueError("--repeats must be >= 1, --duration > 0 and --warmup >= 0")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    workloads = {category: workload(category, args.num_prompts) for category in args.categories}
    if args.check_ties and args.temperature != 0:
        raise ValueError("--check-ties compares greedy outputs: it needs --temperature 0")
    modes = tuple(args.modes)
    compared: list[Compared] | None = [] if args.check_ties else None
    unknown = sorted({m.draft for m in map(parse_mode, modes) if m.draft} - set(args.drafts))
    if unknown:
        raise ValueError(f"modes run over drafts {unknown} that --drafts does not start")
    extra = [ModelConfig(name, quantization=args.draft_quantization) for name in args.drafts]
    with ServedStack(config.target, config.draft, args.confidence_threshold, extra_drafts=extra) as stack:
        clients, rows = stack.load_clients, []
        if args.concurrency:
            rows += sweep(clients, workloads, args.concurrency, args.max_tokens, args.requests_per_client,
                          temperature=args.temperature, modes=modes, repeats=args.repeats,
                          duration_s=args.duration, warmup_s=args.warmup, compared=compared)  # fmt: skip
        for category, prompts in workloads.items() if args.request_rate else ():
            rows += rate_sweep(clients, prompts, args.request_rate, args.max_tokens, args.num_requests,
                               temperature=args.temperature, category=category, modes=modes,
                               compared=compared)  # fmt: skip
    real_departures = 0
    if compared is not None:  # the workers have stopped: the target is loaded here alone
        from specserve.models.loading import load_model

        real_departures = check_departures(load_model(config.target), compared)
    if args.json:
        command = "specserve " + " ".join(sys.argv[1:])
        summary = {"date": started, "command": command, "machine": machine(), "rows": rows}
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    if real_departures:
        print(f"NOT LOSSLESS: {real_departures} outputs departed from target-only away from a near-tie")
        return 1
    return 0
