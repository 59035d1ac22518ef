"""The Grafana dashboard's panels (deploy/grafana/specserve.json) rendered with matplotlib from live /metrics
samples: `python -m specserve.bench.dashboard --url http://127.0.0.1:8000 --seconds 60 --out FILE.png`
scrapes a running orchestrator every second while sending it requests through the HTTP API."""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]
PROMPTS = ["def quicksort(items):", "class Stack:\n    def push(self, x):", "import os\n", "def fib(n):", "SELECT"]
WINDOW_S = 10.0  # like rate(...[10s]) in the dashboard


def scrape(url: str) -> Sample:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def drive(url: str, model: str, stop: threading.Event, api_key: str | None, seed: int) -> None:
    """One client: mixed prompts, lengths and k; now and then a bad request (shown as a status)."""
    rng = random.Random(seed)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    while not stop.is_set():
        body: dict[str, object] = {"model": model, "prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(16, 64),
                                   "temperature": rng.choice([0.0, 0.0, 0.8])}  # fmt: skip
        if rng.random() < 0.5:
            body["num_speculative_tokens"] = rng.choice([2, 4, 6])
        if rng.random() < 0.05:
            body["temperature"] = -1.0
        request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
        try:
            urllib.request.urlopen(request, timeout=120).read()
        except urllib.error.HTTPError:
            pass  # 400s and 429s are part of the picture


def record(url: str, seconds: float, clients: int, api_key: str | None = None) -> list[tuple[float, Sample]]:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
        model = json.loads(response.read())["data"][0]["id"]
    stop = threading.Event()
    threads = [threading.Thread(target=drive, args=(url, model, stop, api_key, i), daemon=True) for i in range(clients)]
    started, samples = time.monotonic(), []
    try:
        for i, thread in enumerate(threads):  # clients join one by one: the load ramps up
            thread.start()
            if i + 1 < len(threads):
                samples.append((time.monotonic() - started, scrape(url)))
                time.sleep(seconds / (2 * len(threads)))
        while time.monotonic() - started < seconds:
            samples.append((time.monotonic() - started, scrape(url)))
            time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(130)
    return samples


def _window(samples: list[tuple[float, Sample]]) -> list[tuple[float, Sample, Sample, float]]:
    """(t, earlier sample, this sample, seconds between) with the earlier one about WINDOW_S back."""
    out = []
    for i, (t, now) in enumerate(samples):
        j = next((j for j in range(i) if t - samples[j][0] <= WINDOW_S), i)
        if j < i:
            out.append((t, samples[j][1], now, t - samples[j][0]))
    return out


def _sum(sample: Sample, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in sample.items() if n == name and set(labels.items()) <= set(ls))


def _quantile(before: Sample, after: Sample, name: str, q: float, **labels: str) -> float | None:
    """histogram_quantile(q, increase(name_bucket[window])) as Prometheus interpolates it."""
    buckets: dict[float, float] = {}
    for (n, ls), v in after.items():
        d = dict(ls)
        if n == name + "_bucket" and all(d.get(k) == x for k, x in labels.items()):
            le = float(d["le"])
            buckets[le] = buckets.get(le, 0.0) + v - before.get((n, ls), 0.0)
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    rank, lower, below = q * buckets[edges[-1]], 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-12)
        lower, below = le, buckets[le]
    return None


def _ratio(before: Sample, after: Sample, name: str) -> float | None:
    count = _sum(after, name + "_count") - _sum(before, name + "_count")
    return (_sum(after, name + "_sum") - _sum(before, name + "_sum")) / count if count else None


def render(samples: list[tuple[float, Sample]], out: Path, title: str) -> Path:
    windows = _window(samples)
    fig, axes = plt.subplots(3, 3, figsize=(15, 10))
    fig.suptitle(title)
    t = [w[0] for w in windows]

    def panel(ax: plt.Axes, heading: str, unit: str, series: dict[str, Callable[[Sample, Sample, float], float | None]]
              ) -> None:  # fmt: skip
        for label, fn in series.items():
            values = [fn(b, a, dt) for _, b, a, dt in windows]
            ax.plot(t, [float("nan") if v is None else v for v in values], label=label)
        ax.set_title(heading, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7)

    statuses = sorted({dict(ls)["status"] for (n, ls) in samples[-1][1] if n == "specserve_requests_total"})
    panel(axes[0][0], "Requests by status", "req/s", {
        s: (lambda b, a, dt, s=s: (_sum(a, "specserve_requests_total", status=s)
                                   - _sum(b, "specserve_requests_total", status=s)) / dt) for s in statuses
    })  # fmt: skip
    panel(axes[0][1], "Tokens generated", "tokens/s", {
        "all requests": lambda b, a, dt: (_sum(a, "specserve_generation_tokens_total")
                                          - _sum(b, "specserve_generation_tokens_total")) / dt,
        "per request, p50": lambda b, a, dt: _quantile(b, a, "specserve_request_tokens_per_second", 0.5),
    })  # fmt: skip
    panel(axes[0][2], "Acceptance rate per request", "accepted / proposed", {
        "mean": lambda b, a, dt: _ratio(b, a, "specserve_request_acceptance_rate"),
        "p10": lambda b, a, dt: _quantile(b, a, "specserve_request_acceptance_rate", 0.1),
        "p90": lambda b, a, dt: _quantile(b, a, "specserve_request_acceptance_rate", 0.9),
    })  # fmt: skip
    panel(axes[1][0], "Speculation per round (means)", "tokens", {
        "k used": lambda b, a, dt: _ratio(b, a, "specserve_speculation_length"),
        "accepted": lambda b, a, dt: _ratio(b, a, "specserve_accepted_tokens_per_round"),
    })  # fmt: skip
    panel(axes[1][1], "Time to first token", "seconds", {
        f"p{int(q * 100)}": (lambda b, a, dt, q=q: _quantile(b, a, "specserve_time_to_first_token_seconds", q))
        for q in (0.5, 0.95)
    })  # fmt: skip
    panel(axes[1][2], "Time per output token", "seconds", {
        f"p{int(q * 100)}": (lambda b, a, dt, q=q: _quantile(b, a, "specserve_time_per_output_token_seconds", q))
        for q in (0.5, 0.95)
    })  # fmt: skip
    panel(axes[2][0], "Queue depth and running requests", "requests", {
        "queued": lambda b, a, dt: _sum(a, "specserve_requests_queued"),
        "running": lambda b, a, dt: _sum(a, "specserve_requests_running"),
    })  # fmt: skip
    replicas = sorted({ls for (n, ls) in samples[-1][1] if n == "specserve_replica_sessions"})
    panel(axes[2][1], "Active sessions per replica", "sessions", {
        f"{dict(ls)['role']} {dict(ls)['replica']}": (lambda b, a, dt, ls=ls: a.get(("specserve_replica_sessions", ls)))
        for ls in replicas
    })  # fmt: skip
    rpc = "specserve_rpc_duration_seconds"
    panel(axes[2][2], "Internal RPC latency", "seconds", {
        f"{service}.{method} p{int(q * 100)}": (
            lambda b, a, dt, s=service, m=method, q=q: _quantile(b, a, rpc, q, service=s, method=m))
        for service, method in (("TargetService", "Verify"), ("DraftService", "Propose")) for q in (0.5, 0.99)
    })  # fmt: skip
    for ax in axes[2]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.dashboard", description=__doc__)
    parser.add_argument("--url", required=True, help="the orchestrator's HTTP API, e.g. http://127.0.0.1:8000")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients, joining one by one")
    parser.add_argument("--api-key", help="when the server requires one")
    parser.add_argument("--title", default="specserve: live /metrics")
    parser.add_argument("--out", type=Path, default=Path("docs/plots/dashboard.png"))
    args = parser.parse_args(argv)
    samples = record(args.url.rstrip("/"), args.seconds, args.clients, args.api_key)
    print(f"wrote {render(samples, args.out, args.title)} from {len(samples)} scrapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
