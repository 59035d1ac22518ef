"""OpenMP's wait policy for processes that run a model on the CPU; import this before torch (libgomp reads
its settings once, when torch loads it). Workers spin at libgomp's default within a pass and put their team
to sleep when their model thread goes idle (docs/architecture.md, "Model execution: OpenMP")."""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Callable

SPIN_COUNT = 300_000
OMP_PAUSE_SOFT = 1
_OPENMP_LIBRARY = re.compile(r"\S*/lib(?:gomp|iomp5|omp)[\w.-]*\.so[\w.]*")


def openmp_env() -> dict[str, str]:
    """The settings for a worker process's environment; what this process was given wins."""
    return {"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", str(SPIN_COUNT))}


def configure_openmp() -> None:
    """Apply openmp_env() to this process; call before torch is imported."""
    os.environ.update(openmp_env())


def release_idle_threads() -> bool:
    """Put the OpenMP team of the calling thread to sleep now rather than after its spin (OpenMP 5's
    omp_pause_resource_all, soft pause); its next parallel region forms it again. False where this process
    has no OpenMP runtime loaded that offers it (then the team sleeps after its spin as before)."""
    pause = _pause_function()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0


@functools.cache
def _pause_function() -> Callable[[int], int] | None:
    """omp_pause_resource_all of the OpenMP runtime torch loaded (found in this process's mapped files)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = dict.fromkeys(_OPENMP_LIBRARY.findall(maps.read()))
    except OSError:  # not Linux
        return None
    for path in paths:
        try:
            function = ctypes.CDLL(path).omp_pause_resource_all  # the loaded library: dlopen shares it
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
        return function
    return None
