"""Where a worker computes (boot id, device, the cores it may run on): enough for the orchestrator to tell a
draft and a target that share CPU cores, where rounds run in turn and the draft borrows every core instead
of pre-drafting on its share (docs/architecture.md, "Shared cores")."""

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
