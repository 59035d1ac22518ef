"""How the default target's greedy outputs (the GGUF as published, llama.cpp's kernels) agree with the same
weights dequantised to float32 and run by torch: both served target-only on the first N HumanEval prompts,
raw, `--max-tokens` greedy tokens each (`ignore_eos`); per prompt, the tokens generated before the first
difference. Usage: .venv/bin/python scripts/engine_agreement.py [--num-prompts 10] [--json OUT.json]"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from specserve.bench.config import PIPELINED
from specserve.bench.lossless import first_difference
from specserve.bench.served import ServedStack
from specserve.bench.workloads import workload
from specserve.models.config import ModelConfig
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specserve_client import SpecServeClient

ENGINES = {
    "llama.cpp (GGUF as published)": ModelConfig(DEFAULT_TARGET, engine="llama.cpp"),
    "torch float32 (dequantised)": ModelConfig(DEFAULT_TARGET, engine="torch", dtype="float32"),
}


def outputs(target: ModelConfig, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """Greedy target-only token ids per prompt, served."""
    # loaded but unused (every request is target-only); on the target's engine, so their contexts agree
    draft = dataclasses.replace(ModelConfig.for_role("draft", DEFAULT_DRAFT), engine=target.engine)
    with ServedStack(target, draft) as stack, SpecServeClient(stack.addresses[PIPELINED]) as client:
        return [
            list(client.generate(p, max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True).token_ids)
            for p in prompts
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    prompts = [text for text, _ in workload("code", args.num_prompts)]
    runs = {name: outputs(config, prompts, args.max_tokens) for name, config in ENGINES.items()}
    (name_a, a), (name_b, b) = runs.items()
    differences = [first_difference(x, y) for x, y in zip(a, b)]
    print(f"{name_a} against {name_b}, {len(prompts)} prompts x {args.max_tokens} greedy tokens:")
    for i, at in enumerate(differences):
        print(f"  prompt {i}: " + ("identical" if at is None else f"first difference after {at} tokens"))
    identical = sum(at is None for at in differences)
    print(f"identical: {identical}/{len(prompts)}")
    if args.json:
        with open(args.json, "w") as file:
            date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            figures = {"max_tokens": args.max_tokens, "first_difference": differences, "outputs": runs}
            json.dump({"date": date, "engines": list(runs), **figures}, file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
