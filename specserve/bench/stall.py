"""`python -m specserve.bench.stall`: what a long prompt arriving costs the requests already decoding.

One client streams code requests back to back through the served stack; after a warm-up a second client
sends a long prompt. Per prefill chunk size of the workers: the longest and the mean gap between two
streamed chunks of the first client while the long prompt was being prefilled, its tokens/s then, and
the long request's time to first token. Without chunks the prompt's one pass holds both models.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from specserve.bench.config import PIPELINED
from specserve.bench.served import ServedStack
from specserve.bench.workloads import workload
from specserve.models.loading import ModelConfig
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET

ONE_PASS = 1_000_000  # a chunk longer than any prompt: the whole prompt in one pass


def measure(target: ModelConfig, draft: ModelConfig, chunk: int, long_prompt: str, warmup_s: float) -> dict:
    with ServedStack(target, draft, worker_args=["--prefill-chunk-tokens", str(chunk)]) as stack:
        client, stop, arrivals = stack.clients[PIPELINED], threading.Event(), []
        short_prompts = workload("code", 10)

        def stream_short() -> None:
            for i in range(10_000):
                if stop.is_set():
                    return
                prompt = short_prompts[i % len(short_prompts)][0]
                for chunk_ in client.stream(prompt, max_tokens=128, ignore_eos=True):
                    arrivals.append((time.perf_counter(), len(chunk_.token_ids)))

        streamer = threading.Thread(target=stream_short)
        streamer.start()
        time.sleep(warmup_s)
        started = time.perf_counter()
        first = None
        for chunk_ in client.stream(long_prompt, max_tokens=16, ignore_eos=True):
            first = first or time.perf_counter()
            prompt_tokens = chunk_.stats.prompt_tokens or None
        stop.set()
        streamer.join()
    assert first is not None
    during = [t for t, _ in arrivals if started <= t <= first]
    gaps = [b - a for a, b in zip(during, during[1:])]
    tokens = sum(n for t, n in arrivals if started <= t <= first)
    return {
        "prefill_chunk_tokens": None if chunk == ONE_PASS else chunk,
        "long_prompt_tokens": prompt_tokens,
        "long_ttft_s": first - started,
        "max_gap_s": max(gaps, default=first - started),
        "mean_gap_s": statistics.mean(gaps) if gaps else first - started,
        "short_tokens_per_second_during_prefill": tokens / (first - started),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.stall", description=__doc__)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--long", default="long-4096", help="the long prompt's workload category (long-N)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[ONE_PASS, 256], help="prefill chunk sizes")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of streaming before the long prompt")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    target, draft = ModelConfig(args.target), ModelConfig(args.draft, quantization="auto")
    long_prompt = workload(args.long, 1)[0][0]
    rows = []
    for chunk in args.chunks:
        rows.append(measure(target, draft, chunk, long_prompt, args.warmup))
        row = rows[-1]
        print(
            f"chunk {row['prefill_chunk_tokens'] or 'none':>5}  long prompt {row['long_prompt_tokens']} tokens: "
            f"TTFT {row['long_ttft_s']:.1f} s; the streaming client meanwhile: longest gap {row['max_gap_s']:.2f} s, "
            f"mean gap {row['mean_gap_s']:.2f} s, {row['short_tokens_per_second_during_prefill']:.2f} tok/s",
            flush=True,
        )
    if args.json:
        summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
