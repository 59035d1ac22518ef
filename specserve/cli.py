"""`specserve generate | demo | bench | models`: the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from specserve.config import EngineConfig, GenerationRequest
from specserve.core.types import SamplingParams
from specserve.models.loading import DTYPES, QUANTIZATIONS, ModelConfig
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, PRESETS

DEMO_PROMPT = 'def quicksort(items: list[int]) -> list[int]:\n    """Sort items with quicksort."""\n'


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("models")
    g.add_argument("--target", "--model", default=DEFAULT_TARGET, help="target: preset, HF model id or directory")
    g.add_argument("--draft", default=DEFAULT_DRAFT, help="draft: preset, HF model id or directory; 'none' for none")
    for role in ("target", "draft"):
        g.add_argument(f"--{role}-dtype", default="auto", choices=["auto", *DTYPES])
        g.add_argument(f"--{role}-device", default="auto")
    g.add_argument("--draft-quantization", default="auto", choices=QUANTIZATIONS)
    g.add_argument("--trust-remote-code", action="store_true", help="run modelling code shipped with HF models")
    g.add_argument("-k", "--num-speculative-tokens", type=int, default=4, help="drafts per round; 0 = target-only")


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    target = ModelConfig(args.target, args.target_device, args.target_dtype, args.trust_remote_code)
    draft = None
    if args.draft.lower() != "none":
        draft = ModelConfig(
            args.draft, args.draft_device, args.draft_dtype, args.trust_remote_code, args.draft_quantization
        )
    return EngineConfig(target, draft, args.num_speculative_tokens if draft else 0)


def _add_request_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("request")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids, stats")
    g.add_argument("--stream", action="store_true", help="print text as it is generated")


def _request(args: argparse.Namespace, prompt: str) -> GenerationRequest:
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    if args.chat:
        return GenerationRequest(
            messages=(("user", prompt),), max_tokens=args.max_tokens, sampling=sampling, stop=tuple(args.stop)
        )
    return GenerationRequest(prompt=prompt, max_tokens=args.max_tokens, sampling=sampling, stop=tuple(args.stop))


def cmd_generate(args: argparse.Namespace, prompt: str | None = None) -> int:
    from specserve.engine import SpeculativeEngine

    prompt = prompt if prompt is not None else (args.prompt if args.prompt != "-" else sys.stdin.read())
    engine = SpeculativeEngine.from_config(_engine_config(args))
    request = _request(args, prompt)
    for chunk in engine.stream(request):
        if args.stream and not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result, stats = chunk.result, chunk.result.stats
    k = engine.num_speculative_tokens if request.num_speculative_tokens is None else request.num_speculative_tokens
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
                          "stats": stats.to_dict()}))  # fmt: skip
        return 0
    print("" if args.stream else result.text)
    print(
        f"\n[{result.finish_reason}] {stats.num_generated} tokens in {stats.total_s:.2f}s = "
        f"{stats.tokens_per_second:.2f} tok/s, first token after {stats.time_to_first_token_s * 1000:.0f} ms; "
        f"k={k}, "
        f"accepted {stats.num_accepted}/{stats.num_proposed} drafts ({stats.acceptance_rate:.0%}), "
        f"{stats.mean_acceptance_length:.2f} tokens per round over {stats.num_rounds} rounds; "
        f"time in draft {stats.draft_s:.2f}s, in target {stats.target_s:.2f}s",
        file=sys.stderr,
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from specserve.bench.report import format_table
    from specserve.bench.runner import BenchConfig, run_bench

    cfg = BenchConfig(
        target=args.target, draft=args.draft, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
        ks=tuple(args.ks), target_dtype=args.target_dtype, draft_quantization=args.draft_quantization,
        hf_fp32_draft=not args.no_fp32_draft,
    )  # fmt: skip
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary = run_bench(cfg)
    summary["date"] = started
    summary["command"] = "specserve " + " ".join(sys.argv[1:])
    print(format_table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from specserve.models.loading import default_home, ensure_converted, verify_converted

    home = default_home()
    if args.action == "list":
        for preset in PRESETS.values():
            print(f"{preset.name:22} {preset.description}")
        print(f"cache: {home}")
        return 0
    for name in args.names or [DEFAULT_TARGET, DEFAULT_DRAFT]:
        preset = PRESETS.get(name)
        if preset is None or not hasattr(preset.source, "sha256"):
            print(f"{name}: not a downloadable preset (see `specserve models list`)", file=sys.stderr)
            return 2
        directory = ensure_converted(preset, home)
        if args.action == "verify":
            verify_converted(preset, home)
        print(f"{name}: ready in {directory}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserve", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for PROMPT ('-' reads stdin)")
    gen.add_argument("prompt")
    _add_model_flags(gen)
    _add_request_flags(gen)

    demo = sub.add_parser("demo", help="the default pair on a code prompt, with speculation stats")
    _add_model_flags(demo)
    _add_request_flags(demo)

    bench = sub.add_parser("bench", help="HumanEval throughput: target-only vs speculative vs HF assisted")
    _add_model_flags(bench)
    bench.add_argument("--num-prompts", type=int, default=10)
    bench.add_argument("--max-tokens", type=int, default=128)
    bench.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8])
    bench.add_argument("--no-fp32-draft", action="store_true", help="skip the modes with a float32 draft")
    bench.add_argument("--json", metavar="PATH", help="also write the summary as JSON")

    models = sub.add_parser("models", help="list presets; fetch or verify their weights")
    models.add_argument("action", choices=["list", "fetch", "verify"])
    models.add_argument("names", nargs="*")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "demo":
            args.stream = True
            print(DEMO_PROMPT, end="")
            return cmd_generate(args, DEMO_PROMPT)
        if args.command == "bench":
            return cmd_bench(args)
        return cmd_models(args)
    except ValueError as error:  # bad input: say what was wrong, no traceback
        print(f"specserve: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
