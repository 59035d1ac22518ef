"""What one forward pass costs on this machine, per engine: the target's decode step, its verification
windows of 2..9 tokens, and the draft's step, in process (no serving); and the sequential bound these
costs allow speculation at a given acceptance rate. `python -m specserve.bench.engine_costs --help`.

The bound: with per-token acceptance alpha, k drafts per round commit E = (1 - alpha^(k+1)) / (1 - alpha)
tokens for k draft steps and one (k + 1)-token window, so tokens/s = E / (k * draft_step + window(k + 1)),
against 1 / step for target-only. It is what a sequential draft-then-verify loop reaches at best; pipelining
hides part of the draft's time, serving adds host overhead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specserve.models.config import ENGINES, ModelConfig
from specserve.models.loading import LoadedModel, load_model
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specserve.models.runner import ModelRunner

CONTEXT_TOKENS = 200  # the cache the passes attend to: a HumanEval prompt's length
WINDOWS = range(1, 10)


@dataclass(frozen=True, slots=True)
class PassCosts:
    engine: str
    target_ms: dict[int, float]  # window length (1 = a decode step) -> median ms
    draft_step_ms: float | None

    def window_ratio(self, length: int) -> float:
        return self.target_ms[length] / self.target_ms[1]


def pass_ms(loaded: LoadedModel, length: int, repeats: int) -> float:
    """Median wall time of a pass over `length` new tokens after CONTEXT_TOKENS cached ones."""
    vocab = min(loaded.vocab_size, 5000)
    context = [(i * 7919) % vocab for i in range(CONTEXT_TOKENS)]
    runner = ModelRunner(loaded)
    sequence = runner.new_sequence(context)
    sequence.prefill()
    times = []
    for repeat in range(repeats + 1):  # the first pass warms up
        sequence.truncate(CONTEXT_TOKENS - 1)
        sequence.token_ids.extend(context[-1:] + [(repeat * 31 + j) % vocab for j in range(length - 1)])
        started = time.perf_counter()
        sequence.feed(length)
        times.append((time.perf_counter() - started) * 1000)
    runner.release(sequence)
    return statistics.median(times[1:])


def measure(target: LoadedModel, draft: LoadedModel | None, repeats: int) -> PassCosts:
    with torch.inference_mode():
        target_ms = {length: pass_ms(target, length, repeats) for length in WINDOWS}
        draft_ms = pass_ms(draft, 1, repeats) if draft is not None else None
    return PassCosts(target.engine, target_ms, draft_ms)


def sequential_bound(costs: PassCosts, alpha: float, k: int) -> float:
    """Speculative tokens/s over target-only tokens/s for a sequential loop at acceptance alpha and k drafts."""
    if k == 0:
        return 1.0
    expected = sum(alpha**i for i in range(k + 1))
    draft = (costs.draft_step_ms or 0.0) * k
    return expected / (draft + costs.target_ms[k + 1]) * costs.target_ms[1]


def best_bound(costs: PassCosts, alpha: float) -> tuple[int, float]:
    """The k (0 = target-only) with the highest sequential bound at alpha, and that bound."""
    return max(((k, sequential_bound(costs, alpha, k)) for k in range(0, max(WINDOWS))), key=lambda kb: kb[1])


def print_table(costs: PassCosts, alphas: list[float]) -> None:
    step = costs.target_ms[1]
    print(f"engine {costs.engine}: target step {step:.1f} ms ({1000 / step:.1f} tok/s), draft step "
          f"{costs.draft_step_ms:.1f} ms" if costs.draft_step_ms else f"engine {costs.engine}: step {step:.1f} ms")
    print("| window tokens | " + " | ".join(str(n) for n in WINDOWS) + " |")
    print("|---|" + "---:|" * len(WINDOWS))
    print("| ms | " + " | ".join(f"{costs.target_ms[n]:.1f}" for n in WINDOWS) + " |")
    print("| x step | " + " | ".join(f"{costs.window_ratio(n):.2f}" for n in WINDOWS) + " |")
    for alpha in alphas:
        for label, draftless in (("model draft", False), ("draft-free (lookup)", True)):
            probe = PassCosts(costs.engine, costs.target_ms, None if draftless else costs.draft_step_ms)
            k, bound = best_bound(probe, alpha)
            print(f"alpha {alpha:.2f}, {label}: best k {k}, sequential bound {bound:.2f}x target-only")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT, help="'none': target only")
    parser.add_argument("--engine", default="auto", choices=ENGINES)
    parser.add_argument("--threads", type=int, help="target threads (default: torch's); the draft gets the same")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9])
    parser.add_argument("--json", type=Path, help="also write the costs here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(ModelConfig(args.target, device="cpu", engine=args.engine))
    draft = None
    if args.draft.lower() != "none":
        draft = load_model(ModelConfig(args.draft, device="cpu", engine=args.engine, quantization="auto"))
    costs = measure(target, draft, args.repeats)
    print_table(costs, args.alphas)
    if args.json:
        args.json.write_text(json.dumps(asdict(costs), indent=1))


if __name__ == "__main__":
    main()
