"""llama.cpp as a peer in `specserve bench`: `llama-server` on the same GGUF files, one server per mode,
each prompt sent to every mode in turn with specserve's own modes (bench/runner.py); under load, a server per
mode with a slot per client, its modes in turns with the served ones (bench/load.py).

Modes: llama.cpp target-only, its speculation with the draft model at each `--llama-cpp-draft-max`, and (one
client) its prompt lookup (`ngram-simple`). The binaries come from a llama.cpp build (`scripts/build_llama_cpp.sh`
builds the version pinned there); each request is timed end to end, as the served modes are.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from protos import specserve_pb2 as pb
from specserve.bench.config import BenchConfig, Prompt, Runner, RunOutput, SweepConfig
from specserve.bench.load import Peers, prompt_token_ids
from specserve.bench.streams import Chunk, Send, StreamError
from specserve.bench.streams import Prompt as LoadPrompt
from specserve.core.stats import SpeculationStats
from specserve.models.config import default_home
from specserve.models.draft_names import parse_draft_name
from specserve.models.fetch import ensure_gguf
from specserve.models.loading import load_tokenizer, tiny_gguf
from specserve.models.registry import SplitGGUF, TinySpec, get_preset

SERVER_BINARY = "llama-server"
START_TIMEOUT_S = 300.0
CONTEXT_MARGIN = 64  # tokens a slot holds beyond its prompt and output: a draft window's overshoot


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
        body = _completion(prompt, max_tokens, ignore_eos)
        request = urllib.request.Request(f"{self.url}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=900) as response:
            answer = json.loads(response.read())
        seconds = time.perf_counter() - started
        return [int(t) for t in answer["tokens"]], seconds, float(answer["timings"]["prompt_ms"]) / 1000

    def stream(self, prompt_token_ids: list[int], max_tokens: int) -> CompletionStream:
        """Greedy, streamed, ignoring EOS as the load bench's served modes do."""
        return CompletionStream(self.url, _completion(prompt_token_ids, max_tokens, True) | {"stream": True})


def _completion(prompt: str | list[int], max_tokens: int, ignore_eos: bool) -> dict:
    """A greedy /completion request's body; a list prompt is token ids, sent as they are."""
    return {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "seed": 0,
            "cache_prompt": False, "return_tokens": True, "ignore_eos": ignore_eos}  # fmt: skip


class CompletionStream:
    """A streamed /completion (server-sent events) as the load bench's Stream: the tokens of each event, then
    llama-server's counts (drafts proposed and accepted, prompt tokens). cancel() shuts its socket, which
    also ends the request in llama-server."""

    def __init__(self, url: str, body: dict) -> None:
        address = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=900)
        self.body, self.cancelled = body, False
        self.sock: socket.socket | None = None  # the connection lets go of it once the response has it

    def __iter__(self) -> Iterator[Chunk]:
        try:
            self.connection.connect()
            self.sock = self.connection.sock
            if self.cancelled:  # cancelled before its socket was there to shut
                raise StreamError("cancelled before it was sent", cancelled=True)
            self.connection.request("POST", "/completion", json.dumps(self.body), {"Content-Type": "application/json"})
            response = self.connection.getresponse()
            if response.status != 200:
                raise StreamError(f"llama-server answered {response.status}: {response.read()[:300]!r}", False)
            for line in response:
                if line.startswith(b"data: "):
                    event = json.loads(line[len(b"data: ") :])
                    if "error" in event:
                        raise StreamError(f"llama-server: {event['error']}", False)
                    final = bool(event.get("stop"))
                    yield [int(t) for t in event.get("tokens", [])], _stats(event) if final else None
                    if final:
                        return
            raise StreamError("llama-server's stream ended before its last event", self.cancelled)
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise StreamError(f"llama-server: {error!r}", self.cancelled) from error
        finally:
            self.connection.close()

    def cancel(self) -> None:
        self.cancelled = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread
            except OSError:  # closed meanwhile
                pass


def _stats(event: dict) -> pb.GenerationStats:
    timings = event.get("timings", {})
    proposed, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    return pb.GenerationStats(proposed=proposed, accepted=accepted, prompt_tokens=event.get("tokens_evaluated", 0))


def server_command(binary: Path, target: Path, mode: PeerMode, threads: int, port: int, slots: int = 1,
                   slot_context: int = 4096) -> list[str]:  # fmt: skip
    """llama-server with `slots` sequences decoded together (-np; continuous batching is its default), each
    holding `slot_context` tokens: it divides -c among its slots."""
    return [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-c", str(slot_context * slots), "-np", str(slots), *mode.args]  # fmt: skip


def slot_context(prompt_tokens: int, max_tokens: int) -> int:
    """A slot's context for the longest prompt and its output, with a margin, in llama.cpp's 256-token steps."""
    return -(-(prompt_tokens + max_tokens + CONTEXT_MARGIN) // 256) * 256


@contextmanager
def llama_server(
    binaries: Path, target: Path, mode: PeerMode, threads: int, slots: int = 1, context: int = 4096
) -> Iterator[LlamaServer]:
    """`context`: each slot's."""
    binary = binaries / SERVER_BINARY
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} not found: build llama.cpp with scripts/build_llama_cpp.sh")
    port = _free_port()
    command = server_command(binary, target, mode, threads, port, slots, context)
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
    stack: ExitStack, binaries: Path, target: Path, modes: list[PeerMode], threads: int, slots: int = 1,
    context: int = 4096,
) -> list[tuple[PeerMode, LlamaServer]]:  # fmt: skip
    """A server per mode, all kept up (idle ones take no CPU) so that prompts go to the modes in turns."""
    servers = (llama_server(binaries, target, mode, threads, slots, context) for mode in modes)
    return [(mode, stack.enter_context(server)) for mode, server in zip(modes, servers)]


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
    target, draft = _gguf_pair(cfg.target, cfg.draft, home or default_home())
    threads = os.cpu_count() or 1
    modes = peer_modes(draft, cfg.llama_cpp_draft_max, lookup=True)
    settings = f"llama.cpp {target.name}, {threads} threads (llama-server)"
    return [
        (mode.name, "target-only" if not mode.args else "peer", settings, _runner(server, cfg))
        for mode, server in start_all(stack, Path(cfg.peer_llama_cpp), target, modes, threads)
    ]


def load_peers(sweep: SweepConfig, target_name: str, draft_name: str, home: Path | None = None) -> Peers:
    """The peer's modes for `specserve bench load --peer-llama-cpp BIN_DIR` (no prompt lookup): at N clients a
    server per mode with N slots, each holding the longest prompt and its output; the prompts' token ids as the
    orchestrator tokenizes them; llama-server's threads as at one client."""
    assert sweep.peer_llama_cpp is not None
    home = home or default_home()
    target, draft = _gguf_pair(target_name, draft_name, home)
    tokenizer = load_tokenizer(target_name, home)
    modes = peer_modes(draft, sweep.llama_cpp_draft_max, lookup=False)

    @contextmanager
    def at_load(prompts: list[LoadPrompt], concurrency: int) -> Iterator[dict[str, Send]]:
        token_ids = {prompt: prompt_token_ids(tokenizer, prompt) for prompt in prompts}
        context = slot_context(max(map(len, token_ids.values())), sweep.max_tokens)
        with ExitStack() as stack:
            servers = start_all(stack, Path(sweep.peer_llama_cpp or ""), target, modes, os.cpu_count() or 1,
                                concurrency, context)  # fmt: skip
            yield {mode.name: functools.partial(_send, server, token_ids) for mode, server in servers}

    return at_load


def _send(
    server: LlamaServer, token_ids: dict[LoadPrompt, list[int]], prompt: LoadPrompt, max_tokens: int
) -> CompletionStream:
    return server.stream(token_ids[prompt], max_tokens)


def _gguf_pair(target: str, draft: str, home: Path) -> tuple[Path, Path | None]:
    """The target's GGUF file and the draft model's, if the draft has a model (not prompt lookup alone)."""
    draft_name, _ = parse_draft_name(draft)
    return gguf_path(target, home), gguf_path(draft_name, home) if draft_name else None


def gguf_path(name: str, home: Path) -> Path:
    """The GGUF file of a preset (fetched and verified), or a `.gguf` path. The tiny test models' has no
    vocabulary (llama-server fails on it): for tests with a stand-in server."""
    preset = get_preset(name)
    if preset is not None and isinstance(preset.source, SplitGGUF):
        return ensure_gguf(preset.source, home / "gguf")
    if preset is not None and isinstance(preset.source, TinySpec):
        return tiny_gguf(preset, home)
    if name.endswith(".gguf") and Path(name).is_file():
        return Path(name)
    raise ValueError(f"the llama.cpp peer runs GGUF files: {name!r} is neither a GGUF preset nor a .gguf file")


def _runner(server: LlamaServer, cfg: BenchConfig) -> Runner:
    def run(prompt: Prompt) -> RunOutput:
        token_ids, seconds, prompt_s = server.complete(prompt.text, cfg.max_tokens, cfg.ignore_eos)
        return token_ids, seconds, SpeculationStats(time_to_first_token_s=prompt_s), 0

    return run
