"""OpenMP's wait policy for processes that run a model on the CPU. Import this before torch: libgomp, torch's
OpenMP runtime, reads its settings once, when torch loads it.

torch's CPU threads are an OpenMP team. Between two parallel regions libgomp's threads spin before they
sleep, GOMP_SPINCOUNT times (300,000 unless set: milliseconds). Within a forward pass regions follow each
other within microseconds, so a team that sleeps pays a wake-up for each of a pass's ~800 regions; but when
a draft and a target share a machine's cores and both are busy (under load), long spins hold cores the
other process needs. A few thousand spins keep a pass's threads awake between its own regions and free a
core soon after (docs/benchmarks.md, "OpenMP's wait between parallel regions"). GNU OpenMP only (torch's
Linux wheels); other OpenMP runtimes ignore the variable.
"""

from __future__ import annotations

import os

SPIN_COUNT = 3000


def openmp_env() -> dict[str, str]:
    """The settings for a worker process's environment; what this process was given wins."""
    return {"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", str(SPIN_COUNT))}


def configure_openmp() -> None:
    """Apply openmp_env() to this process; call before torch is imported."""
    os.environ.update(openmp_env())
