"""Render a bench summary as a fixed-width table."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from specserve.models.llama_cpp import cpu_flags

COLUMNS = (
    ("mode", "mode", "{}"),
    ("tok/s", "tokens_per_second", "{:.2f}"),
    ("decode tok/s", "decode_tokens_per_second", "{:.2f}"),
    ("speedup", "speedup_vs_target", "{:.2f}x"),
    ("accept", "acceptance_rate", "{:.3f}"),
    ("alpha", "per_token_acceptance", "{:.3f}"),
    ("acc/round", "mean_accepted_per_round", "{:.2f}"),
    ("tok/round", "mean_acceptance_length", "{:.2f}"),
    ("c", "c", "{:.3f}"),
    ("v_k", "v_k", "{:.3f}"),
    ("theory", "theoretical_speedup", "{:.2f}x"),
    ("efficiency", "efficiency", "{:.0%}"),
    ("identical", "identical_to_target_only", "{}"),
    ("wire ms/round", "transport_ms_per_round", "{:.1f}"),
    ("host ms/round", "host_overhead_ms_per_round", "{:.2f}"),
    ("vs in-process", "served_vs_in_process", "{:.0%}"),
)


def format_table(summary: dict[str, Any]) -> str:
    cells = [[head for head, _, _ in COLUMNS]]
    for row in summary["modes"]:
        cells.append([fmt.format(row[key]) if row.get(key) is not None else "-" for _, key, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        f"speedup: against the fastest target-only mode ({summary['baseline']}); "
        f"one target pass over 1 token = {summary['target_step_ms']} ms",
        "accept = accepted / proposed; alpha = accepted / (accepted + rejections), per examined draft",
        "theory: (1 - alpha^(k+1)) / ((1 - alpha)(k c + v_k)) from the measured alpha, c, v_k; "
        "efficiency = speedup over target-only with the same target / theory",
        "host ms/round (served): wall time per round less the draft's and the target's forward passes it waited "
        "for (specserve/bench/overhead.py)",
    ]
    return "\n".join(lines + [""] + notes)


def machine() -> dict[str, Any]:
    """What ran the benchmark (recorded with its figures: a shared host's hardware can change between runs)."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
        flags = cpu_flags()
        cpu += "".join(f", {flag}" for flag in ("amx_bf16", "avx512_bf16") if flag in flags)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }
