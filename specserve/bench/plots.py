"""PNG plots from the benchmark JSON files: `python -m specserve.bench.plots --out results/plots`.

speedup-vs-k.png            from `specserve bench latency --json` (specserve and HF assisted, per k), plus the served
                            stack at one client from a `--concurrency 1 --modes k=1 k=2 ...` run
throughput-vs-concurrency.png  from `specserve bench load --concurrency ... --json` (per mode)
speedup-vs-k-by-load.png    from that k sweep run at several concurrencies: one line per load, adaptive
                            marked at its mean k
acceptance-by-category.png  from a `--categories` run (acceptance and speedup per category and mode)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def speedup_vs_k(bench: dict, out: Path, k_sweep: dict | None = None) -> Path:
    by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in _served_k_points(k_sweep):  # the runs' dates in the legend: they may be days (and hosts) apart
        by_kind[f"specserve served, 1 client{_dated(k_sweep)}"].append(row)
    for mode in bench["modes"]:
        if mode["k"] and mode.get("speedup_vs_target") and mode["k"] <= 16:
            kind = "HF assisted" if mode["mode"].startswith("hf") else "specserve in process"
            by_kind[kind + _dated(bench)].append((mode["k"], mode["speedup_vs_target"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, points in by_kind.items():
        best: dict[float, float] = {}
        for k, speedup in points:
            best[k] = max(speedup, best.get(k, 0.0))
        ks = sorted(best)
        ax.plot(ks, [best[k] for k in ks], marker="o", label=kind)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="target-only")
    ax.set(xlabel="k (drafts per round)", ylabel=f"speedup vs {bench['baseline']}", title="Speedup vs k")
    ax.legend()
    return _save(fig, out / "speedup-vs-k.png")


def _dated(run: dict | None) -> str:
    return f" ({run['date'][:10]})" if run and run.get("date") else ""


def _served_k_points(k_sweep: dict | None, concurrency: int = 1, adaptive: bool = False) -> list[tuple[float, float]]:
    """(k, speedup vs the run's target-only) for the greedy fixed-k rows at `concurrency`; `adaptive`:
    (mean k, speedup) of the adaptive rows instead."""
    rows = [r for r in (k_sweep or {"rows": []})["rows"] if r["concurrency"] == concurrency and r["temperature"] == 0]
    base = {r["category"]: r["tokens_per_second"] for r in rows if r["mode"] == "target-only"}
    if adaptive:
        wanted = [(r["mean_k"], r) for r in rows if r["mode"] == "adaptive"]
    else:
        wanted = [(int(r["mode"][2:]), r) for r in rows if r["mode"].startswith("k=") and r["mode"][2:].isdigit()]
    return [(k, r["tokens_per_second"] / base[r["category"]]) for k, r in wanted if r["category"] in base]


def speedup_vs_k_by_load(k_sweep: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for concurrency in sorted({r["concurrency"] for r in k_sweep["rows"]}):
        points = sorted(_served_k_points(k_sweep, concurrency))
        line = ax.plot([k for k, _ in points], [s for _, s in points], marker="o", label=f"{concurrency} clients")
        adaptive = _served_k_points(k_sweep, concurrency, adaptive=True)
        ax.scatter([k for k, _ in adaptive], [s for _, s in adaptive], marker="*", s=120, color=line[0].get_color())
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="target-only")
    ax.set(xlabel="k (drafts per round); star: adaptive at its mean k", ylabel="speedup vs target-only at that load",
           title="Speedup vs k under load (served)")  # fmt: skip
    ax.legend(fontsize="small")
    return _save(fig, out / "speedup-vs-k-by-load.png")


def throughput_vs_concurrency(load: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, rows in _by(load["rows"], "mode").items():
        rows = sorted(rows, key=lambda r: r["concurrency"])
        ax.plot([r["concurrency"] for r in rows], [r["tokens_per_second"] for r in rows], marker="o", label=mode)
    ax.set(xlabel="concurrent clients", ylabel="output tokens/s (all clients)", title="Throughput vs concurrency")
    concurrencies = sorted({r["concurrency"] for r in load["rows"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.legend()
    return _save(fig, out / "throughput-vs-concurrency.png")


def acceptance_by_category(load: dict, out: Path) -> Path:
    rows = [r for r in load["rows"] if r["concurrency"] == 1]
    categories = list(dict.fromkeys(r["category"] for r in rows))
    base = {r["category"]: r["tokens_per_second"] for r in rows if r["mode"] == "target-only"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    modes = [m for m in _by(rows, "mode") if m != "target-only"]
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        mine = {r["category"]: r for r in rows if r["mode"] == mode}
        xs = [c + i * width for c in range(len(categories))]
        left.bar(xs, [mine[c]["acceptance_rate"] or 0 for c in categories], width, label=mode)
        right.bar(xs, [mine[c]["tokens_per_second"] / base[c] for c in categories], width, label=mode)
    for ax, label in ((left, "acceptance (accepted / proposed)"), (right, "speedup vs target-only")):
        ax.set_xticks([c + width * (len(modes) - 1) / 2 for c in range(len(categories))], categories, rotation=20)
        ax.set_ylabel(label)
        ax.legend()
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    fig.suptitle("By category, one client")
    return _save(fig, out / "acceptance-by-category.png")


def _by(rows: list[dict], key: str) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return groups


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.plots", description=__doc__)
    parser.add_argument("--bench", default="results/bench-humaneval-latest.json")
    parser.add_argument("--load", default="results/bench-load-latest.json")
    parser.add_argument("--categories", default="results/bench-categories-latest.json")
    parser.add_argument("--k-sweep", default="results/bench-k-sweep.json", help="used when it exists")
    parser.add_argument("--out", default="results/plots")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    k_sweep = _optional(args.k_sweep)
    written = [
        speedup_vs_k(json.loads(Path(args.bench).read_text()), out, k_sweep),
        throughput_vs_concurrency(json.loads(Path(args.load).read_text()), out),
        acceptance_by_category(_with_code(args), out),
    ]
    if k_sweep is not None:
        written.append(speedup_vs_k_by_load(k_sweep, out))
    for path in written:
        print(f"wrote {path}")
    return 0


def _optional(path: str) -> dict | None:
    return json.loads(Path(path).read_text()) if Path(path).exists() else None


def _with_code(args: argparse.Namespace) -> dict:
    """The category rows, plus the code rows at one client from the load sweep."""
    categories = json.loads(Path(args.categories).read_text())
    code = [r for r in json.loads(Path(args.load).read_text())["rows"] if r["concurrency"] == 1]
    return {"rows": code + categories["rows"]}


if __name__ == "__main__":
    raise SystemExit(main())
