"""Replays the adaptive-k policy against a load sweep's measurements, in seconds instead of an hour.

A served sweep (`specserve bench load --concurrency ... --modes target-only k=1 ... k=8 --json`) measures, per
load, each fixed k's throughput and per-position acceptance. From them this module rebuilds what the
policy sees: a session round at (load, k) lasts `load x tokens per round / throughput` seconds, with the
acceptance of the deepest window's rows, and noise and stalls (another request's prefill holding the
model) on top. Then it drives `AdaptivePolicy` through the loads in the sweep's order, for many random paths,
and reports what a real sweep can only sample once: how often adaptive falls below 0.98x target-only at a
load, and how often the best fixed k itself would, measured in the same window (the noise floor).
A landscape can also be built from an engine's step costs (`StepCosts`: a draft step, the verify of a
window by its length), where the policy also sees its propose and verify calls' seconds.

Run: `python -m specserve.bench.adaptive_replay results/bench-k-sweep.json [--paths 100]`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.adaptive import AdaptiveConfig, AdaptivePolicy, tokens_per_round

RULE = 0.98  # issue 5: adaptive at least 0.98x target-only at every load


@dataclass(frozen=True, slots=True)
class StepCosts:
    """A round run in turn on one engine: k draft steps, then the verify of k + 1 tokens."""

    draft_step_s: float
    verify_s: dict[int, float]
    """Window length (tokens) to the verify's seconds; linear between the lengths given, and beyond the
    longest along the slope of the last two."""

    def verify(self, length: int) -> float:
        lengths = sorted(self.verify_s)
        if length in self.verify_s:
            return self.verify_s[length]
        below = [n for n in lengths if n < length][-1:] or lengths[:1]
        above = [n for n in lengths if n > length][:1] or lengths[-1:]
        n0, n1 = (below[0], above[0]) if below[0] != above[0] else (lengths[-2], lengths[-1])
        s0, s1 = self.verify_s[n0], self.verify_s[n1]
        return s0 + (s1 - s0) * (length - n0) / (n1 - n0)

    def round_s(self, k: int) -> float:
        return k * self.draft_step_s + self.verify(k + 1)


@dataclass(frozen=True, slots=True)
class Landscape:
    """Per load: tokens per second of each measured k (0 is target-only) and the draft's acceptance at
    each window position given the positions before it were accepted; `steps`, where the landscape was
    built from an engine's step costs."""

    throughput: dict[int, dict[int, float]]
    acceptance: dict[int, list[float]]
    steps: dict[int, StepCosts] | None = None

    @classmethod
    def from_costs(cls, steps: StepCosts, acceptance: Sequence[float], loads: Sequence[int] = (1,)) -> Landscape:
        """Every k up to len(acceptance) on an engine whose round costs `steps` at each of `loads` (a batch
        of sessions runs its rounds together: each session's round costs what a lone one does)."""
        rates = list(acceptance)
        throughput = {
            load: {k: load * tokens_per_round(rates[:k]) / steps.round_s(k) for k in range(len(rates) + 1)}
            for load in loads
        }
        return cls(throughput, {load: rates for load in loads}, {load: steps for load in loads})

    @classmethod
    def from_rows(cls, rows: Sequence[dict]) -> Landscape:
        """From a sweep's greedy rows of fixed modes ("target-only", "k=N"); adaptive rows are ignored."""
        throughput: dict[int, dict[int, float]] = {}
        deepest: dict[int, tuple[int, list[float]]] = {}
        for row in rows:
            k = _fixed_k(row["mode"])
            if k is None or row.get("temperature", 0.0) != 0.0 or row.get("request_rate") is not None:
                continue
            load = row["concurrency"]
            throughput.setdefault(load, {})[k] = row["tokens_per_second"]
            if k > deepest.get(load, (0, []))[0]:
                deepest[load] = (k, row["acceptance_at_position"])
        for load, by_k in throughput.items():
            if 0 not in by_k or load not in deepest:
                raise ValueError(f"load {load}: the sweep needs target-only and at least one k > 0")
        acceptance = {load: conditional(rates) for load, (_, rates) in deepest.items()}
        return cls(throughput, acceptance)

    @property
    def loads(self) -> list[int]:
        return sorted(self.throughput)

    def max_k(self, load: int) -> int:
        return len(self.acceptance[load])

    def tokens_per_second(self, load: int, k: int) -> float:
        """Measured, or interpolated linearly between the nearest measured k on either side."""
        by_k = self.throughput[load]
        if k in by_k:
            return by_k[k]
        below, above = max(m for m in by_k if m < k), min(m for m in by_k if m > k)
        return by_k[below] + (by_k[above] - by_k[below]) * (k - below) / (above - below)

    def expected_tokens(self, load: int, k: int) -> float:
        return tokens_per_round(self.acceptance[load][:k])

    def round_seconds(self, load: int, k: int) -> float:
        """A session's round at (load, k), such that replaying the acceptance gives the measured throughput."""
        return load * self.expected_tokens(load, k) / self.tokens_per_second(load, k)

    def speedup(self, load: int, k: int) -> float:
        return self.tokens_per_second(load, k) / self.throughput[load][0]


def conditional(rates: Sequence[float]) -> list[float]:
    """Per-position acceptance as the sweep reports it (the share of drafts at position i accepted) to the
    acceptance at i given that those before it were accepted."""
    result, before = [], 1.0
    for rate in rates:
        result.append(min(1.0, rate / before) if before > 0 else 0.0)
        before = rate
    return result


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    seconds_per_load: float = 90.0
    """The policy's time at each load (the k sweep: 30 s of warm-up and a 60 s window per mode)."""
    warmup_s: float = 30.0
    """Tokens count after this much of each load, as in the bench's timed windows."""
    noise: float = 0.15
    """Log-normal spread of a round's seconds."""
    stall_probability: float = 0.05
    stall_factor: float = 2.5
    """A round stalled by another request's prefill lasts this many times longer."""
    catch_up_s: float = 0.4
    """Per session, the draft catching up on its context when k leaves 0 (a draft prefill of 100-230 tokens
    took 0.24-0.48 s in the served sweeps here); on the round after, for the whole batch."""
    catch_up_tokens: int = 160
    """The context tokens a draft lacks at k = 0, as the policy is told (a whole context, as `catch_up_s` costs)."""
    short_batch: float = 0.2
    """Share of decisions taken one session short (a session between requests): where that is another batch
    size bucket (3 of 4 sessions is; 15 of 16 is not) the bucket changes between decisions."""
    early_stop: float = 0.0
    """Share of windows the draft ends early (a low-confidence draft), at a position uniform in 1..k-1. In a
    batch the session's verify call still lasts the batch's pass, which the deepest window sets."""
    request_tokens: int = 0
    """Tokens a session's request emits before the next one prefills (0: no prefills). A prefill holds every
    session of the batch, and the policy is told the stall (as a served replica's prefill clock tells it)."""
    prefill_s: float = 1.0
    """A new request's target prefill at k = 0, in seconds."""
    prefill_beside_draft: float = 1.5
    """At k > 0 the new request's draft prefills beside its target on the same cores: its seconds times this."""
    prefill_tokens: int = 150
    paths: int = 100


def replay(
    landscape: Landscape,
    config: ReplayConfig,
    seed: int,
    fixed_k: int | None = None,
    loads: Sequence[int] | None = None,
) -> dict[int, tuple[float, float]]:
    """One path through the loads in order (all of the sweep's by default): per load, tokens per second in
    the window and the mean k there. `fixed_k` replays a fixed mode instead of the policy."""
    rng = random.Random(seed)
    max_k = min(landscape.max_k(load) for load in landscape.loads)
    policy = AdaptivePolicy(AdaptiveConfig(max_k=max_k, initial_k=min(4, max_k)))
    policy.observe_draft_prefill(config.catch_up_s, config.catch_up_tokens, now=0.0)  # as the first request's
    now, result, previous_k = 0.0, {}, policy.k
    for load in loads or landscape.loads:
        end, counted_from = now + config.seconds_per_load, now + config.warmup_s
        tokens, ks = 0, []
        since_prefill = [rng.randrange(config.request_tokens) if config.request_tokens else 0 for _ in range(load)]
        prefills = 0
        while now < end:
            batch_size = load - 1 if load > 1 and rng.random() < config.short_batch else load
            k = policy.choose(batch_size, now) if fixed_k is None else fixed_k
            spread = math.exp(rng.gauss(0.0, config.noise))
            seconds = landscape.round_seconds(load, k) * spread
            draft_s, verify_s = _calls(landscape, load, k, spread)
            if rng.random() < config.stall_probability:
                seconds *= config.stall_factor
            stalled_s = _prefills(policy, config, prefills, k, now)
            seconds, prefills = seconds + stalled_s, 0
            if previous_k == 0 and k > 0:
                seconds += load * config.catch_up_s
            previous_k = k
            now += seconds
            for session in range(load):  # every session of the batch finishes this round
                drafted = rng.randint(1, k - 1) if k > 1 and rng.random() < config.early_stop else k
                num_accepted = _accepted(rng, landscape.acceptance[load][:drafted])
                if load == 1:  # alone, the verify call is the session's own window
                    verify_s = _calls(landscape, load, drafted, spread)[1]
                policy.observe(
                    batch_size, k, num_accepted, seconds, now, num_drafted=drafted, stalled_s=stalled_s,
                    draft_s=draft_s, verify_s=verify_s, draft_lag=config.catch_up_tokens,
                )  # fmt: skip
                tokens += (num_accepted + 1) if now > counted_from else 0
                since_prefill[session] += num_accepted + 1
                if config.request_tokens and since_prefill[session] >= config.request_tokens:
                    since_prefill[session] -= config.request_tokens  # its next request prefills next round
                    prefills += 1
            if now > counted_from:
                ks.append(k)
        result[load] = (tokens / (config.seconds_per_load - config.warmup_s), statistics.fmean(ks or [0]))
    return result


def evaluate(landscape: Landscape, config: ReplayConfig, loads: Sequence[int] | None = None) -> list[dict]:
    """Per load over `config.paths` paths: adaptive's speedup (each path against a target-only path of its
    own, as a sweep measures it), the share of paths below the rule, the same for the best fixed k, and
    adaptive's mean tokens per second over the best fixed k's and target-only's, replayed alike.
    `loads`: those of the sweep to replay, in this order (a fresh policy meets the first)."""
    samples: dict[int, list[tuple[float, float, float, float]]] = {load: [] for load in loads or landscape.loads}
    best = {load: max(range(landscape.max_k(load) + 1), key=lambda k: landscape.speedup(load, k)) for load in samples}
    for path in range(config.paths):
        adaptive = replay(landscape, config, seed=3 * path, loads=list(samples))
        target_only = replay(landscape, config, seed=3 * path + 1, fixed_k=0, loads=list(samples))
        for load in samples:
            fixed = replay(landscape, config, seed=3 * path + 2, fixed_k=best[load], loads=[load])
            samples[load].append((adaptive[load][0], adaptive[load][1], fixed[load][0], target_only[load][0]))
    rows = []
    for load, values in samples.items():
        ratios = sorted(a / t for a, _, _, t in values)
        adaptive_tps, fixed_tps, target_only_tps = (statistics.fmean(v[i] for v in values) for i in (0, 2, 3))
        rows.append({
            "concurrency": load,
            "best_fixed_k": best[load],
            "best_fixed_speedup": landscape.speedup(load, best[load]),
            "adaptive_mean_speedup": statistics.fmean(ratios),
            "adaptive_p10_speedup": ratios[len(ratios) // 10],
            "adaptive_below_rule": sum(r < RULE for r in ratios) / len(ratios),
            "adaptive_mean_k": statistics.fmean(v[1] for v in values),
            "best_fixed_below_rule": sum(f / t < RULE for _, _, f, t in values) / len(values),
            "adaptive_vs_best_fixed": adaptive_tps / fixed_tps,
            "adaptive_vs_target_only": adaptive_tps / target_only_tps,
        })  # fmt: skip
    return rows


def _calls(landscape: Landscape, load: int, k: int, spread: float) -> tuple[float | None, float | None]:
    """The propose and verify calls' seconds of a round, where the landscape knows its engine's steps."""
    if landscape.steps is None:
        return None, None
    steps = landscape.steps[load]
    return k * steps.draft_step_s * spread, steps.verify(k + 1) * spread


def _prefills(policy: AdaptivePolicy, config: ReplayConfig, count: int, k: int, now: float) -> float:
    """Seconds `count` new requests' prefills hold the batch, one after another, each told to the policy."""
    seconds = config.prefill_s * (config.prefill_beside_draft if k > 0 else 1.0)
    for _ in range(count):
        policy.observe_target_prefill(seconds, config.prefill_tokens, k > 0, alone=True, now=now)
    return count * seconds


def _accepted(rng: random.Random, rates: Sequence[float]) -> int:
    for i, rate in enumerate(rates):
        if rng.random() >= rate:
            return i
    return len(rates)


def _fixed_k(mode: str) -> int | None:
    if mode == "target-only":
        return 0
    if mode.startswith("k=") and mode[2:].isdigit():
        return int(mode[2:])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specserve.bench.adaptive_replay", description=__doc__.split("\n")[0]
    )
    parser.add_argument("sweep", help="a load sweep's JSON with target-only and fixed-k rows")
    defaults = ReplayConfig()
    parser.add_argument("--paths", type=int, default=defaults.paths)
    parser.add_argument("--seconds-per-load", type=float, default=defaults.seconds_per_load)
    parser.add_argument("--noise", type=float, default=defaults.noise)
    parser.add_argument("--catch-up-s", type=float, default=defaults.catch_up_s)
    parser.add_argument("--short-batch", type=float, default=defaults.short_batch)
    parser.add_argument("--loads", type=int, nargs="+", help="replay these of the sweep's loads, in this order")
    args = parser.parse_args(argv)
    with open(args.sweep) as file:
        landscape = Landscape.from_rows(json.load(file)["rows"])
    config = ReplayConfig(
        seconds_per_load=args.seconds_per_load,
        noise=args.noise,
        catch_up_s=args.catch_up_s,
        short_batch=args.short_batch,
        paths=args.paths,
    )
    print(f"{'clients':>7} {'best k':>6} {'its x':>6} {'adaptive x':>10} {'p10':>5} {'mean k':>6} "
          f"{'adaptive <0.98':>14} {'best k <0.98':>12} {'vs best k':>9}")  # fmt: skip
    for row in evaluate(landscape, config, args.loads):
        print(
            f"{row['concurrency']:>7} {row['best_fixed_k']:>6} {row['best_fixed_speedup']:>6.2f} "
            f"{row['adaptive_mean_speedup']:>10.3f} {row['adaptive_p10_speedup']:>5.2f} {row['adaptive_mean_k']:>6.1f} "
            f"{row['adaptive_below_rule']:>14.0%} {row['best_fixed_below_rule']:>12.0%} "
            f"{row['adaptive_vs_best_fixed']:>9.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
