"""`specserve bench --concurrency N ...`: closed-loop clients streaming back-to-back requests through a
served stack, per mode (target-only, fixed k, adaptive): aggregate output tokens/s, request latency
p50/p99, time to first token, acceptance, and how often outputs equal target-only's."""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

from orchestrator.client import SpecServeClient

MODES: dict[str, int | None] = {"target-only": 0, "k=4": 4, "adaptive": None}


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
    errors: list[str] = field(default_factory=list)

    def summary(self, reference: LoadRun | None) -> dict:
        tokens = sum(len(t) for t in self.outputs.values())
        identical = None
        if reference is not None and self.temperature == 0:  # sampled outputs differ by design
            identical = sum(reference.outputs.get(key) == out for key, out in self.outputs.items())
        return {
            "temperature": self.temperature,
            "category": self.category,
            "mode": self.mode,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "requests": len(self.outputs),
            "errors": len(self.errors),
            "tokens_per_second": tokens / self.seconds if self.seconds else 0.0,
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
            "mean_prompt_tokens": self.prompt_tokens / len(self.outputs) if self.outputs else 0.0,
            "identical_to_target_only": identical,
        }


def run_load(
    client: SpecServeClient,
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
            _request(client, run, lock, (index, j), prompt, max_tokens)

    return _timed(run, [threading.Thread(target=client_loop, args=(i,)) for i in range(concurrency)])


def run_rate(
    client: SpecServeClient,
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
        _request(client, run, lock, (i, 0), prompts[i % len(prompts)], max_tokens)

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
    client: SpecServeClient,
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
    try:
        for chunk in client.stream(
            **message, max_tokens=max_tokens, num_speculative_tokens=MODES[run.mode], ignore_eos=True,
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
        run.proposed += stats.proposed
        run.accepted += stats.accepted
        run.rounds += stats.rounds
        run.prompt_tokens += stats.prompt_tokens


def sweep(
    client: SpecServeClient,
    workloads: dict[str, list[Prompt]],
    concurrencies: list[int],
    max_tokens: int,
    requests_per_client: int,
    log: bool = True,
    temperature: float = 0.0,
) -> list[dict]:
    """Every mode at every concurrency for every workload, modes back to back per (workload, concurrency)."""
    rows = []
    for category, prompts in workloads.items():
        for concurrency in concurrencies:
            reference = None
            for mode in MODES:
                run = run_load(
                    client, mode, concurrency, prompts, max_tokens, requests_per_client, category, temperature
                )
                reference = reference or run
                rows.append(run.summary(reference))
                if log:
                    print(format_row(rows[-1]), flush=True)
    return rows


def rate_sweep(
    client: SpecServeClient,
    prompts: list[Prompt],
    request_rates: list[float],
    max_tokens: int,
    num_requests: int,
    log: bool = True,
    temperature: float = 0.0,
    category: str = "code",
) -> list[dict]:
    """Every mode at every request rate (the same arrival times for every mode)."""
    rows = []
    for rate in request_rates:
        reference = None
        for mode in MODES:
            run = run_rate(client, mode, rate, prompts, max_tokens, num_requests, category, temperature)
            reference = reference or run
            rows.append(run.summary(reference))
            if log:
                print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict) -> str:
    acceptance = "" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}"
    return (
        f"{row['category']:18} {_load_label(row):7} prompt {row['mean_prompt_tokens']:5.0f}  "
        f"{row['mode']:12} {row['tokens_per_second']:7.2f} tok/s  "
        f"p50 {row['latency_p50_s']:6.2f}s p99 {row['latency_p99_s']:6.2f}s  ttft {row['ttft_p50_ms']:6.0f} ms  "
        f"tpot {row['tpot_ms']:6.0f} ms  accept {acceptance:4}  k {row['mean_k']:4.1f}  "
        f"identical {row['identical_to_target_only']}/{row['requests']}  errors {row['errors']}"
    )


def _load_label(row: dict) -> str:
    return f"{row['request_rate']:g}/s" if row.get("request_rate") else f"c={row['concurrency']}"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
