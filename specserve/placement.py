"""Where a worker computes: enough for the orchestrator to tell a draft and a target that share CPU cores.

Sharing changes what pays. With cores of its own, a draft that pre-drafts while the target verifies hides
its time; on the target's own cores it only takes cores the verification needs (on two shared cores a
lone session's verify call took 250 ms with a pre-draft beside it against 129 ms alone), and the draft's
steps are faster on all the cores than on its share of them. So on such a pair rounds run one after the
other and lend the draft every core (1.22x the throughput at k = 4 for one session, docs/benchmarks.md,
"Shared cores"), and a target's sessions take turns, drafting together and verifying together
(orchestrator/turns.py; 8 clients: 1.11x target-only, from 0.74-0.84x).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True, slots=True)
class Placement:
    host: str
    """The kernel's boot id (the host name where there is none): the same for every process on a machine,
    in containers too, and different on another machine or after a reboot."""
    device: str
    """torch's name for it: "cpu", "cuda:0", ..."""
    cpus: frozenset[int]
    """The cores the worker may run on."""

    def shares_cores_with(self, other: Placement) -> bool:
        """Both compute on the CPU of one machine, on at least one core in common."""
        return self.device == other.device == "cpu" and self.host == other.host and bool(self.cpus & other.cpus)


def this_process(device: str) -> Placement:
    return Placement(_host_id(), device, frozenset(_usable_cpus()))


def usable_cpu_count() -> int:
    return len(_usable_cpus())


def _host_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:  # not Linux
        return socket.gethostname()


def _usable_cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))
