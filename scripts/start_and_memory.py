"""Start `specserve serve` with its defaults twice: seconds from the start to the first generated token, and
the peak resident memory of the worker processes (Ray's WorkerActor) while two 128-token requests run.
Usage: .venv/bin/python scripts/start_and_memory.py OUT.json"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from specserve_client import SpecServeClient

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["def quicksort(items):", "class LRUCache:\n    def __init__(self, capacity):"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def workers_rss_mb() -> dict[str, int]:
    """pid -> resident MB of every Ray WorkerActor process."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"WorkerActor" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
            found[pid] = int(line.split()[1]) // 1024
        except (OSError, StopIteration):
            continue
    return found


def first_token_s(address: str, started: float) -> float:
    while time.time() - started < 600:
        try:
            with SpecServeClient(address, timeout_s=60) as client:
                client.generate("def fib(n):", max_tokens=1)
            return time.time() - started
        except Exception:  # noqa: BLE001 - not serving yet
            time.sleep(0.5)
    raise TimeoutError("no first token within 600 s")


def peak_rss_while_serving(address: str) -> dict[str, int]:
    peak: dict[str, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = workers_rss_mb()
            if sum(now.values()) > sum(peak.values()):
                peak.clear()
                peak.update(now)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with SpecServeClient(address, timeout_s=300) as client:
        for prompt in PROMPTS:
            client.generate(prompt, max_tokens=128, ignore_eos=True)
    done.set()
    sampler.join()
    return peak


def main(out: str) -> None:
    results = []
    for attempt in range(2):
        port = free_port()
        started = time.time()
        process = subprocess.Popen([str(ROOT / ".venv/bin/specserve"), "serve", "--port", str(port), "--no-http"],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
        try:
            address = f"127.0.0.1:{port}"
            seconds = first_token_s(address, started)
            peak = peak_rss_while_serving(address)
        finally:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(60)
        results.append({"attempt": attempt + 1, "start_to_first_token_s": round(seconds, 1),
                        "workers_rss_peak_mb": sum(peak.values()), "per_worker_mb": sorted(peak.values())})  # fmt: skip
        print(results[-1], flush=True)
    Path(out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
