"""llama.cpp as a peer in `specserve bench`: `llama-server` on the same GGUF files, one server per mode,
each prompt sent to every mode in turn with specserve's own modes (bench/runner.py).

Modes: llama.cpp target-only, its speculation with the draft model at each `--llama-cpp-draft-max`, and its
prompt lookup (`ngram-simple`). The binaries come from a llama.cpp build (`scripts/build_llama_cpp.sh` builds
the version pinned there); each request is timed end to end, as the served modes are.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from specserve.bench.config import BenchConfig, Prompt, Runner, RunOutput
from specserve.core.stats import SpeculationStats
from specserve.models.config import default_home
from specserve.models.draft_names import parse_draft_name
from specserve.models.fetch import ensure_gguf
from specserve.models.registry import SplitGGUF, get_preset

SERVER_BINARY = "llama-server"
START_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class PeerMode:
    name: str
    args: tuple[str, ...]  # llama-server flags beyond the target, threads and context


def peer_modes(draft: Path | None, draft_max: Sequence[int], lookup: bool) -> list[PeerMode]:
    modes = [PeerMode("llama.cpp target-only", ())]
    if draft is not None:
        for n in draft_max:
            flags = ("-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(n))
            modes.append(PeerMode(f"llama.cpp draft-max={n}", flags))
    if lookup:
        modes.append(PeerMode("llama.cpp ngram", ("--spec-type", "ngram-simple")))
    return modes


class LlamaServer:
    """One llama-server process; `complete` sends a greedy request and times it."""

    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url, self.process = url, process

    def complete(self, prompt: str, max_tokens: int, ignore_eos: bool) -> tuple[list[int], float, float]:
        """Greedy: (token ids, seconds end to end, seconds of the prompt's pass as llama-server times it)."""
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "seed": 0,
                "cache_prompt": False, "return_tokens": True, "ignore_eos": ignore_eos}  # fmt: skip
        request = urllib.request.Request(f"{self.url}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=900) as response:
            answer = json.loads(response.read())
        seconds = time.perf_counter() - started
        return [int(t) for t in answer["tokens"]], seconds, float(answer["timings"]["prompt_ms"]) / 1000


@contextmanager
def llama_server(binaries: Path, target: Path, mode: PeerMode, threads: int, slots: int = 1) -> Iterator[LlamaServer]:
    binary = binaries / SERVER_BINARY
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} not found: build llama.cpp with scripts/build_llama_cpp.sh")
    port = _free_port()
    command = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-c", str(4096 * slots), "-np", str(slots), *mode.args]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, process, mode.name)
        yield LlamaServer(url, process)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def start_all(
    stack: ExitStack, binaries: Path, target: Path, modes: list[PeerMode], threads: int, slots: int = 1
) -> list[tuple[PeerMode, LlamaServer]]:
    """A server per mode, all kept up (idle ones take no CPU) so that prompts go to the modes in turns."""
    return [(mode, stack.enter_context(llama_server(binaries, target, mode, threads, slots))) for mode in modes]


def _wait_healthy(url: str, process: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read().decode(errors="replace")[-2000:] if process.stderr else ""
            raise RuntimeError(f"llama-server for {name} exited with {process.returncode}:\n{error}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"llama-server for {name} did not become healthy in {START_TIMEOUT_S:.0f}s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def llama_cpp_modes(stack: ExitStack, cfg: BenchConfig, home: Path | None) -> list[tuple[str, str, str, Runner]]:
    """The peer's modes for `specserve bench latency --peer-llama-cpp BIN_DIR` as (name, kind, settings,
    runner); the servers are kept up by `stack`."""
    assert cfg.peer_llama_cpp is not None
    home = home or default_home()
    draft_name, _ = parse_draft_name(cfg.draft)
    draft = gguf_path(draft_name, home) if draft_name else None
    threads = os.cpu_count() or 1
    target = gguf_path(cfg.target, home)
    modes = peer_modes(draft, cfg.llama_cpp_draft_max, lookup=True)
    settings = f"llama.cpp {target.name}, {threads} threads (llama-server)"
    return [
        (mode.name, "target-only" if not mode.args else "peer", settings, _runner(server, cfg))
        for mode, server in start_all(stack, Path(cfg.peer_llama_cpp), target, modes, threads)
    ]


def gguf_path(name: str, home: Path) -> Path:
    """The GGUF file of a preset (fetched and verified) or a `.gguf` path."""
    preset = get_preset(name)
    if preset is not None and isinstance(preset.source, SplitGGUF):
        return ensure_gguf(preset.source, home / "gguf")
    if name.endswith(".gguf") and Path(name).is_file():
        return Path(name)
    raise ValueError(f"the llama.cpp peer runs GGUF files: {name!r} is neither a GGUF preset nor a .gguf file")


def _runner(server: LlamaServer, cfg: BenchConfig) -> Runner:
    def run(prompt: Prompt) -> RunOutput:
        token_ids, seconds, prompt_s = server.complete(prompt.text, cfg.max_tokens, cfg.ignore_eos)
        return token_ids, seconds, SpeculationStats(time_to_first_token_s=prompt_s), 0

    return run
