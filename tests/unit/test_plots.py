"""The benchmark plots are drawn from the JSON the benchmarks write."""

from __future__ import annotations

import json
from pathlib import Path

from specserve.bench.plots import _served_k_points, main


def _row(category: str, mode: str, concurrency: int, tok_s: float, acceptance: float | None) -> dict:
    return {"category": category, "mode": mode, "concurrency": concurrency, "tokens_per_second": tok_s,
            "acceptance_rate": acceptance}  # fmt: skip


def test_every_plot_is_a_png(tmp_path: Path) -> None:
    bench = {"baseline": "target-only bfloat16", "modes": [
        {"mode": "specserve k=2", "k": 2, "speedup_vs_target": 1.8},
        {"mode": "specserve k=4", "k": 4, "speedup_vs_target": 2.1},
        {"mode": "hf assisted k=4", "k": 4, "speedup_vs_target": 2.0},
        {"mode": "target-only bfloat16", "k": 0, "speedup_vs_target": 1.0},
    ]}  # fmt: skip
    load = {"rows": [_row("code", m, c, c * (2 if m != "target-only" else 1), None if m == "target-only" else 0.8)
                     for c in (1, 2) for m in ("target-only", "k=4", "adaptive")]}  # fmt: skip
    categories = {"rows": [_row("chat", m, 1, 3.0, None if m == "target-only" else 0.5)
                           for m in ("target-only", "k=4", "adaptive")]}  # fmt: skip
    sweep = (("target-only", 3.0, 0.0), ("k=2", 5.4, 2.0), ("k=8", 4.5, 8.0), ("adaptive", 6.0, 3.5))
    k_sweep = {"rows": [{**_row("code", m, c, c * tok_s, 0.8), "temperature": 0.0, "mean_k": k}
                        for c in (1, 4) for m, tok_s, k in sweep]}  # fmt: skip
    assert _served_k_points(k_sweep) == [(2, 1.8), (8, 1.5)]
    assert _served_k_points(k_sweep, 4, adaptive=True) == [(3.5, 2.0)]
    paths = {}
    for name, data in (("bench", bench), ("load", load), ("categories", categories), ("k-sweep", k_sweep)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    out = tmp_path / "plots"
    args = [arg for name, path in paths.items() for arg in (f"--{name}", str(path))]
    assert main([*args, "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "acceptance-by-category.png", "speedup-vs-k-by-load.png", "speedup-vs-k.png", "throughput-vs-concurrency.png"
    ]  # fmt: skip
    assert all((out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / n).stat().st_size > 5000 for n in names)
