"""OpenMP's wait policy for processes that run a model on the CPU. Import this before torch: libgomp, torch's
OpenMP runtime, reads its settings once, when torch loads it.

torch's CPU threads are an OpenMP team. Between two parallel regions libgomp's threads spin GOMP_SPINCOUNT
times (300,000 unless set) before they sleep, and a team that sleeps pays a wake-up for each region it slept
through; but when a draft and a target share a machine's cores and both are busy (under load), long spins
hold cores the other process needs. 3,000 is the compromise measured on two shared cores: a lone 1.5B
decode step still sleeps through ~260 regions (9% slower than at the default), while 4 clients run 1.2x
faster than at the default and than at 30,000 (docs/benchmarks.md, "OpenMP's wait between parallel regions"
and "The spin count, again"). A worker with cores of its own does better at the default: set GOMP_SPINCOUNT
in its environment. GNU OpenMP only (torch's Linux wheels); other OpenMP runtimes ignore the variable.
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
