"""Render a bench summary as a fixed-width table."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    ("mode", "mode", "{}"),
    ("tok/s", "tokens_per_second", "{:.2f}"),
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
    ]
    return "\n".join(lines + [""] + notes)
