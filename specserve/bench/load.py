"""`specserve bench --concurrency N ...`: closed-loop clients streaming back-to-back requests through a
served stack, per mode (target-only, fixed k, adaptive, with or without the draft's early stop): aggregate
output tokens/s, latency p50/p99, TTFT, TPOT, acceptance (per position too), draft time hidden by
overlap, the bound speculation could reach and the efficiency against it, and identity with target-only."""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.client import SpecServeClient

if TYPE_CHECKING:
    from protos import specserve_pb2 as pb

DEFAULT_MODES = ("target-only", "k=4", "adaptive")
EARLY_STOP = "+stop"  # mode suffix: served by the orchestrator whose draft ends windows on low confidence


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    k: int | None  # None: adaptive
    early_stop: bool = False


def parse_mode(name: str) -> Mode:
    """'target-only', 'k=N', 'adaptive', and either speculative one with '+stop' (e.g. 'adaptive+stop')."""
    base, early_stop = (name[: -len(EARLY_STOP)], True) if name.endswith(EARLY_STOP) else (name, False)
    if base == "target-only" and not early_stop:
        return Mode(name, 0)
    if base == "adaptive":
        return Mode(name, None, early_stop)
    if base.startswith("k=") and base[2:].isdigit() and int(base[2:]) > 0:
        return Mode(name, int(base[2:]), early_stop)
    raise ValueError(f"unknown mode {name!r}: use target-only, k=N (N >= 1) or adaptive, optionally with {EARLY_STOP}")


Clients = Mapping[bool, SpecServeClient]  # early_stop -> the orchestrator to send that mode's requests to


Prompt = tuple[str, bool]  # (text, send through the chat template)


@dataclass
class LoadRun:
    mode: str
    concurrency: int
    category: str = "code"
    temperature: float = 0.0
    request_rate: float | None = None
    """Open-loop arrivals per second (then concurrency is 0)."""
    seconds: float = 0.0
    outputs: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (client, request) -> tokens
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    prompt_tokens: int = 0
    proposed_at_position: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)
    draft_wait_s: float = 0.0
    draft_hidden_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def observe(self, stats: pb.GenerationStats) -> None:
        """Add one request's final statistics."""
        self.proposed += stats.proposed
        self.accepted += stats.accepted
        self.rounds += stats.rounds
        self.prompt_tokens += stats.prompt_tokens
        self.draft_wait_s += stats.draft_ms / 1000
        self.draft_hidden_s += stats.draft_hidden_ms / 1000
        for totals, counts in (
            (self.proposed_at_position, stats.proposed_at_position),
            (self.accepted_at_position, stats.accepted_at_position),
        ):
            totals.extend([0] * (len(counts) - len(totals)))
            for i, count in enumerate(counts):
                totals[i] += count

    def summary(self, reference: LoadRun | None) -> dict:
        """`reference`: the target-only run at the same load (identity, the bound and efficiency)."""
        tokens = sum(len(t) for t in self.outputs.values())
        tokens_per_second = tokens / self.seconds if self.seconds else 0.0
        identical = bound = None
        if reference is not None and self.temperature == 0:  # sampled outputs differ by design
            identical = sum(reference.outputs.get(key) == out for key, out in self.outputs.items())
        mean_acceptance_length = (self.accepted + self.rounds) / self.rounds if self.rounds else 1.0
        if reference is not None and reference.seconds:
            # every round as cheap as a target-only step, the draft free: what speculation could reach
            bound = sum(len(t) for t in reference.outputs.values()) / reference.seconds * mean_acceptance_length
        drafting_s = self.draft_wait_s + self.draft_hidden_s
        return {
            "temperature": self.temperature,
            "category": self.category,
            "mode": self.mode,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "requests": len(self.outputs),
            "errors": len(self.errors),
            "tokens_per_second": tokens_per_second,
            "latency_p50_s": _percentile(self.latencies, 50),
            "latency_p99_s": _percentile(self.latencies, 99),
            "ttft_p50_ms": 1000 * _percentile(self.ttfts, 50),
            "tpot_ms": 1000
            * statistics.mean(
                (lat - ttft) / max(1, len(out) - 1)
                for lat, ttft, out in zip(self.latencies, self.ttfts, self.outputs.values())
            )
            if self.latencies
            else 0.0,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else None,
            "mean_k": self.proposed / self.rounds if self.rounds else 0.0,
            "mean_acceptance_length": mean_acceptance_length,
            "acceptance_at_position": [
                a / p if p else None for a, p in zip(self.accepted_at_position, self.proposed_at_position)
            ],
            "draft_hidden_fraction": self.draft_hidden_s / drafting_s if drafting_s else None,
            "bound_tokens_per_second": bound,
            "efficiency": tokens_per_second / bound if bound else None,
            "mean_prompt_tokens": self.prompt_tokens / len(self.outputs) if self.outputs else 0.0,
            "identical_to_target_only": identical,
        }


def run_load(
    clients: Clients,
    mode: str,
    concurrency: int,
    prompts: list[Prompt],
    max_tokens: int,
    requests_per_client: int,
    category: str = "code",
    temperature: float = 0.0,
) -> LoadRun:
    """Closed loop: `concurrency` clients, each sending its requests back to back."""
    run = LoadRun(mode, concurrency, category, temperature)
    lock = threading.Lock()

    def client_loop(index: int) -> None:
        for j in range(requests_per_client):
            prompt = prompts[(index * requests_per_client + j) % len(prompts)]
            _request(clients, run, lock, (index, j), prompt, max_tokens)

    return _timed(run, [threading.Thread(target=client_loop, args=(i,)) for i in range(concurrency)])


def run_rate(
    clients: Clients,
    mode: str,
    request_rate: float,
    prompts: list[Prompt],
    max_tokens: int,
    num_requests: int,
    category: str = "code",
    temperature: float = 0.0,
    seed: int = 0,
) -> LoadRun:
    """Open loop: requests arrive as a Poisson process at `request_rate` per second, whatever the server does."""
    run = LoadRun(mode, 0, category, temperature, request_rate=request_rate)
    lock = threading.Lock()
    rng = random.Random(seed)
    arrivals = list(itertools.accumulate(rng.expovariate(request_rate) for _ in range(num_requests)))

    def arrive(i: int) -> None:
        time.sleep(arrivals[i])
        _request(clients, run, lock, (i, 0), prompts[i % len(prompts)], max_tokens)

    return _timed(run, [threading.Thread(target=arrive, args=(i,)) for i in range(num_requests)])


def _timed(run: LoadRun, threads: list[threading.Thread]) -> LoadRun:
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.seconds = time.perf_counter() - started
    return run


def _request(
    clients: Clients,
    run: LoadRun,
    lock: threading.Lock,
    key: tuple[int, int],
    prompt: Prompt,
    max_tokens: int,
) -> None:
    text, chat = prompt
    started = time.perf_counter()
    token_ids: list[int] = []
    ttft = None
    message = {"messages": [("user", text)]} if chat else {"prompt": text}
    mode = parse_mode(run.mode)
    try:
        for chunk in clients[mode.early_stop].stream(
            **message, max_tokens=max_tokens, num_speculative_tokens=mode.k, ignore_eos=True,
            temperature=run.temperature,  # no seed: a seeded sample keeps a fixed k
        ):  # fmt: skip
            if chunk.token_ids and ttft is None:
                ttft = time.perf_counter() - started
            token_ids.extend(chunk.token_ids)
            stats = chunk.stats
    except Exception as error:  # noqa: BLE001 - counted and reported
        with lock:
            run.errors.append(str(error))
        return
    with lock:
        run.outputs[key] = token_ids
        run.latencies.append(time.perf_counter() - started)
        run.ttfts.append(ttft or 0.0)
        run.observe(stats)


def sweep(
    clients: Clients,
    workloads: dict[str, list[Prompt]],
    concurrencies: list[int],
    max_tokens: int,
    requests_per_client: int,
    log: bool = True,
    temperature: float = 0.0,
    modes: tuple[str, ...] = DEFAULT_MODES,
) -> list[dict]:
    """Every mode at every concurrency for every workload, modes back to back per (workload, concurrency);
    target-only runs first (the reference), whether asked for or not."""
    rows = []
    for category, prompts in workloads.items():
        for concurrency in concurrencies:
            reference = None
            for mode in _with_reference(modes):
                run = run_load(
                    clients, mode, concurrency, prompts, max_tokens, requests_per_client, category, temperature
                )
                reference = reference or run
                rows.append(run.summary(reference))
                if log:
                    print(format_row(rows[-1]), flush=True)
    return rows


def rate_sweep(
    clients: Clients,
    prompts: list[Prompt],
    request_rates: list[float],
    max_tokens: int,
    num_requests: int,
    log: bool = True,
    temperature: float = 0.0,
    category: str = "code",
    modes: tuple[str, ...] = DEFAULT_MODES,
) -> list[dict]:
    """Every mode at every request rate (the same arrival times for every mode)."""
    rows = []
    for rate in request_rates:
        reference = None
        for mode in _with_reference(modes):
            run = run_rate(clients, mode, rate, prompts, max_tokens, num_requests, category, temperature)
            reference = reference or run
            rows.append(run.summary(reference))
            if log:
                print(format_row(rows[-1]), flush=True)
    return rows


def _with_reference(modes: tuple[str, ...]) -> list[str]:
    for mode in modes:
        parse_mode(mode)  # refuse a bad name before anything runs
    return ["target-only"] + [m for m in modes if m != "target-only"]


def format_row(row: dict) -> str:
    acceptance = "" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}"
    return (
        f"{row['category']:18} {_load_label(row):7} prompt {row['mean_prompt_tokens']:5.0f}  "
        f"{row['mode']:12} {row['tokens_per_second']:7.2f} tok/s  "
        f"p50 {row['latency_p50_s']:6.2f}s p99 {row['latency_p99_s']:6.2f}s  ttft {row['ttft_p50_ms']:6.0f} ms  "
        f"tpot {row['tpot_ms']:6.0f} ms  accept {acceptance:4}  k {row['mean_k']:4.1f}  "
        f"eff {_fraction(row['efficiency'])} hidden {_fraction(row['draft_hidden_fraction'])}  "
        f"identical {row['identical_to_target_only']}/{row['requests']}  errors {row['errors']}"
    )


def _fraction(value: float | None) -> str:
    return "  -" if value is None else f"{value:.2f}"


def _load_label(row: dict) -> str:
    return f"{row['request_rate']:g}/s" if row.get("request_rate") else f"c={row['concurrency']}"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
