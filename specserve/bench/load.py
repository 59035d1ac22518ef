"""`specserve bench load --concurrency N ...`: closed-loop clients streaming back-to-back requests through a
served stack, per mode (target-only, fixed k, adaptive, with or without the draft's early stop): aggregate
output tokens/s, latency p50/p99, TTFT, TPOT, acceptance (per position too), draft time hidden by
overlap, the bound speculation could reach and the efficiency against it, and identity with target-only; a
peer's modes (Peers: llama-server) take turns with them through the same clients."""

from __future__ import annotations

import functools
import itertools
import math
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specserve.bench.streams import Prompt, Send, ServedStream, Stream, StreamError
from specserve_client import SpecServeClient

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protos import specserve_pb2 as pb
    from specserve.models.loading import LoadedModel

DEFAULT_MODES = ("target-only", "k=4", "adaptive")
EARLY_STOP = "+stop"  # mode suffix: served by the orchestrator whose draft ends windows on low confidence
CONTROL = "#"  # 'target-only#2': the mode again, in turns of its own; its ratio to the mode is the bench's noise
OVER = "@"  # 'adaptive@ngram': over the extra draft service `ngram` (bench --drafts), the same target worker


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    k: int | None  # None: adaptive
    early_stop: bool = False
    draft: str = ""  # an extra draft service's name (OVER); "": the main draft

    @property
    def client_key(self) -> bool | str:
        """Which orchestrator serves the mode's requests (Clients)."""
        return self.draft or self.early_stop


def parse_mode(name: str) -> Mode:
    """'target-only', 'k=N', 'adaptive', and either speculative one with '+stop' (e.g. 'adaptive+stop') or
    over an extra draft service ('adaptive@ngram', 'k=4@qwen2.5-coder-0.5b+ngram'); any of them with a
    control label ('target-only#2'), measured alike under its own name."""
    base, _, label = name.partition(CONTROL)
    if CONTROL in name and not label.isalnum():
        raise ValueError(f"unknown mode {name!r}: a control's label is letters or digits ('target-only#2')")
    base, over, draft = base.partition(OVER)
    if over and not draft:
        raise ValueError(f"unknown mode {name!r}: name the draft after {OVER} ('adaptive@ngram')")
    base, early_stop = (base[: -len(EARLY_STOP)], True) if base.endswith(EARLY_STOP) else (base, False)
    if early_stop and draft:
        raise ValueError(f"unknown mode {name!r}: {EARLY_STOP} is measured over the main draft only")
    if base == "target-only" and not early_stop and not draft:
        return Mode(name, 0)
    if base == "adaptive":
        return Mode(name, None, early_stop, draft)
    if base.startswith("k=") and base[2:].isdigit() and int(base[2:]) > 0:
        return Mode(name, int(base[2:]), early_stop, draft)
    raise ValueError(
        f"unknown mode {name!r}: use target-only, k=N (N >= 1) or adaptive, optionally with {EARLY_STOP} or {OVER}DRAFT"
    )


Clients = Mapping[bool | str, SpecServeClient]
"""Mode.client_key -> the orchestrator to send that mode's requests to: early_stop, or an extra draft's name."""


RequestKey = tuple[int, int, int]  # (repeat, client, request): the same prompt in every mode
Peers = Callable[[list[Prompt], int], AbstractContextManager[dict[str, Send]]]
"""(a workload's prompts, concurrency) -> a peer's modes at that load by name, its servers up while the context
is open (so that they run in turns with the served modes, never beside them)."""


@dataclass(slots=True)
class Window:
    """Tokens count from `start`; at `end` the calls still streaming are cancelled (timed runs)."""

    start: float
    end: float = math.inf
    closed: bool = False
    _calls: set[Stream] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, call: Stream) -> None:
        with self._lock:
            self._calls.add(call)
            if self.closed:  # closed while this call was being made
                call.cancel()

    def discard(self, call: Stream) -> None:
        with self._lock:
            self._calls.discard(call)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for call in self._calls:
                call.cancel()


class Opening:
    """A timed run's window opens `warmup_s` after the last client's first token and lasts `duration_s`. Opened
    a fixed time after the start instead, it caught the end of the first prompts' prefills: at 16 clients
    here those took 45 s, and a 30 s warm-up left 15 s of them in a 60 s window, more or less of them by
    mode (target-only's two windows read 5.3 and 8.7 tokens/s in one sweep)."""

    def __init__(self, window: Window, num_clients: int, warmup_s: float, duration_s: float) -> None:
        self.window, self.warmup_s, self.duration_s = window, warmup_s, duration_s
        self._waiting = set(range(num_clients))
        self._lock = threading.Lock()
        self._opened, self._stopped = threading.Event(), threading.Event()

    def client_started(self, index: int) -> None:
        """Client `index` got its first token (or gave up before one); idempotent."""
        with self._lock:
            if index not in self._waiting:
                return
            self._waiting.discard(index)
            if not self._waiting:
                self.window.start = time.perf_counter() + self.warmup_s
                self.window.end = self.window.start + self.duration_s
                self._opened.set()

    def close_at_end(self) -> None:
        """Runs in a thread of its own: closes the window at its end, unless stop() comes first."""
        self._opened.wait()
        if not self._stopped.wait(max(0.0, self.window.end - time.perf_counter())):
            self.window.close()

    def stop(self) -> None:
        self._stopped.set()
        self._opened.set()


@dataclass
class LoadRun:
    mode: str
    concurrency: int
    category: str = "code"
    temperature: float = 0.0
    request_rate: float | None = None
    """Open-loop arrivals per second (then concurrency is 0)."""
    max_tokens: int = 0
    """Of a full-length request (0: every request is)."""
    seconds: float = 0.0
    """The measured window: the whole run, or its timed part (--duration)."""
    counted_tokens: int = 0
    """Tokens received in the measured window, from finished and cut-off requests alike."""
    turns: list[float] = field(default_factory=list)
    """Tokens/s of each turn merged into this run (a shared machine's drift shows as their spread)."""
    outputs: dict[RequestKey, list[int]] = field(default_factory=dict)  # finished requests only
    prompts: dict[RequestKey, Prompt] = field(default_factory=dict)  # of the finished requests
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    prompt_tokens: int = 0
    proposed_at_position: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)
    draft_wait_s: float = 0.0
    draft_hidden_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    peer: bool = False
    """A peer's run: it reports no rounds, so no bound or efficiency."""

    def observe(self, stats: pb.GenerationStats) -> None:
        """Add one request's final statistics."""
        self.proposed += stats.proposed
        self.accepted += stats.accepted
        self.rounds += stats.rounds
        self.prompt_tokens += stats.prompt_tokens
        self.draft_wait_s += stats.draft_ms / 1000
        self.draft_hidden_s += stats.draft_hidden_ms / 1000
        _add_counts(self.proposed_at_position, stats.proposed_at_position)
        _add_counts(self.accepted_at_position, stats.accepted_at_position)

    def merge(self, other: LoadRun) -> None:
        """Add a later run of the same mode and load (its request keys are distinct)."""
        self.seconds += other.seconds
        self.counted_tokens += other.counted_tokens
        self.turns += other.turns
        self.outputs.update(other.outputs)
        self.prompts.update(other.prompts)
        self.latencies += other.latencies
        self.ttfts += other.ttfts
        self.tpots += other.tpots
        self.errors += other.errors
        for name in ("proposed", "accepted", "rounds", "prompt_tokens", "draft_wait_s", "draft_hidden_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        _add_counts(self.proposed_at_position, other.proposed_at_position)
        _add_counts(self.accepted_at_position, other.accepted_at_position)

    def summary(self, reference: LoadRun | None) -> dict:
        """`reference`: the target-only run at the same load (identity, the bound and efficiency)."""
        tokens_per_second = self.counted_tokens / self.seconds if self.seconds else 0.0  # over every turn
        identical = compared = bound = None
        if reference is not None and self.temperature == 0:  # sampled outputs differ by design
            both = [key for key in self.outputs if key in reference.outputs]  # a timed run finishes what it can
            identical = sum(reference.outputs[key] == self.outputs[key] for key in both)
            compared = len(both)
        mean_acceptance_length = (self.accepted + self.rounds) / self.rounds if self.rounds else 1.0
        if reference is not None and reference.seconds and not self.peer:
            # every round as cheap as a target-only step, the draft free: what speculation could reach
            bound = reference.counted_tokens / reference.seconds * mean_acceptance_length
        drafting_s = self.draft_wait_s + self.draft_hidden_s
        return {
            "temperature": self.temperature,
            "category": self.category,
            "mode": self.mode,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "requests": len(self.outputs),
            "errors": len(self.errors),
            "tokens_per_second": tokens_per_second,
            "tokens_per_second_by_turn": self.turns,
            # None when no full-length request finished (a timed run at high load can end before any)
            "latency_p50_s": _percentile(self.latencies, 50),
            "latency_p99_s": _percentile(self.latencies, 99),
            "ttft_p50_ms": _scaled(_percentile(self.ttfts, 50), 1000),
            "tpot_ms": 1000 * statistics.mean(self.tpots) if self.tpots else None,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else None,
            "mean_k": self.proposed / self.rounds if self.rounds else 0.0,
            "mean_acceptance_length": mean_acceptance_length,
            "acceptance_at_position": [
                a / p if p else None for a, p in zip(self.accepted_at_position, self.proposed_at_position)
            ],
            "draft_hidden_fraction": self.draft_hidden_s / drafting_s if drafting_s else None,
            "bound_tokens_per_second": bound,
            "efficiency": tokens_per_second / bound if bound else None,
            "mean_prompt_tokens": self.prompt_tokens / len(self.outputs) if self.outputs else 0.0,
            "identical_to_target_only": identical,
            "compared_to_target_only": compared,
        }


Compared = tuple[dict, LoadRun, LoadRun]  # (summary row, run, the target-only run at the same load)


def run_load(
    clients: Clients,
    mode: str,
    concurrency: int,
    prompts: list[Prompt],
    max_tokens: int,
    requests_per_client: int,
    category: str = "code",
    temperature: float = 0.0,
    repeat: int = 0,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
    send: Send | None = None,
) -> LoadRun:
    """Closed loop: `concurrency` clients, each sending its requests back to back: `requests_per_client`
    each, or (`duration_s`) as many as fit before the window closes, counting the tokens of its
    `duration_s` only: every client is busy all through that window, so the figure is the throughput at
    this concurrency, without the start (every prompt prefilled at once) and the tail (the last clients
    alone) of a fixed batch of requests. The window opens `warmup_s` after every client's first token
    (Opening): a warm-up of a few request lengths lets the clients' phases spread. `send`: a peer's mode
    (None: the served stack's `mode`)."""
    run = LoadRun(mode, concurrency, category, temperature, max_tokens=max_tokens, peer=send is not None)
    send = send or _served(clients, mode, temperature)
    lock = threading.Lock()
    window = Window(math.inf) if duration_s else Window(time.perf_counter())
    opening = Opening(window, concurrency, warmup_s, duration_s) if duration_s else None

    def client_loop(index: int) -> None:
        requests = itertools.count() if duration_s else range(requests_per_client)
        for j in requests:
            prompt = prompts[(index + (repeat * requests_per_client + j) * concurrency) % len(prompts)]
            # timed: first requests of 1/c, 2/c, ... of the length spread the clients' phases, as in a
            # server that has been running (instead of every client prefilling and finishing together)
            tokens = max(1, max_tokens * (index + 1) // concurrency) if duration_s and j == 0 else max_tokens
            started = functools.partial(opening.client_started, index) if opening is not None and j == 0 else None
            key = (repeat, index, j)
            ok = not window.closed and _request(send, run, lock, key, prompt, tokens, window, started)
            if started is not None:
                started()  # also when the request ended without a token
            if duration_s and not ok:  # the window's end, or an error: a timed client does not retry in a loop
                return

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(concurrency)]
    return _timed(run, threads, opening, duration_s)


def run_rate(
    clients: Clients,
    mode: str,
    request_rate: float,
    prompts: list[Prompt],
    max_tokens: int,
    num_requests: int,
    category: str = "code",
    temperature: float = 0.0,
    seed: int = 0,
) -> LoadRun:
    """Open loop: requests arrive as a Poisson process at `request_rate` per second, whatever the server does."""
    run = LoadRun(mode, 0, category, temperature, request_rate=request_rate)
    lock = threading.Lock()
    rng = random.Random(seed)
    arrivals = list(itertools.accumulate(rng.expovariate(request_rate) for _ in range(num_requests)))
    window = Window(time.perf_counter())
    send = _served(clients, mode, temperature)

    def arrive(i: int) -> None:
        time.sleep(arrivals[i])
        _request(send, run, lock, (0, i, 0), prompts[i % len(prompts)], max_tokens, window)

    return _timed(run, [threading.Thread(target=arrive, args=(i,)) for i in range(num_requests)])


def _timed(
    run: LoadRun, threads: list[threading.Thread], opening: Opening | None = None, window_s: float | None = None
) -> LoadRun:
    """Runs the threads; the run's seconds are its measured window's (`window_s`) or, without one, the whole run's."""
    started = time.perf_counter()
    timer = threading.Thread(target=opening.close_at_end) if opening is not None else None
    for thread in threads + ([timer] if timer else []):
        thread.start()
    for thread in threads:
        thread.join()
    if opening is not None and timer is not None:
        opening.stop()
        timer.join()
    run.seconds = window_s or time.perf_counter() - started
    run.turns = [run.counted_tokens / run.seconds if run.seconds else 0.0]
    return run


def _served(clients: Clients, mode: str, temperature: float) -> Send:
    parsed = parse_mode(mode)
    return functools.partial(ServedStream, clients[parsed.client_key], parsed.k, temperature=temperature)


def _request(
    send: Send,
    run: LoadRun,
    lock: threading.Lock,
    key: RequestKey,
    prompt: Prompt,
    max_tokens: int,
    window: Window,
    first_token: Callable[[], None] | None = None,
) -> bool:
    """One streamed request; False when it failed or was cut at the window's end. `first_token` is called
    when its first token arrives."""
    started = time.perf_counter()
    token_ids: list[int] = []
    ttft, counted, stats = None, 0, None
    call = send(prompt, max_tokens)
    window.add(call)
    try:
        for chunk_token_ids, chunk_stats in call:
            now = time.perf_counter()
            if chunk_token_ids and ttft is None:
                ttft = now - started
                if first_token is not None:
                    first_token()
            counted += len(chunk_token_ids) if window.start <= now <= window.end else 0
            token_ids.extend(chunk_token_ids)
            stats = chunk_stats if chunk_stats is not None else stats
    except StreamError as error:
        window.discard(call)
        with lock:
            run.counted_tokens += counted
            if not (window.closed and error.cancelled):  # cut at the window's end
                run.errors.append(str(error))
        return False
    window.discard(call)
    with lock:
        run.counted_tokens += counted
        run.outputs[key] = token_ids
        run.prompts[key] = prompt
        if max_tokens == run.max_tokens or not run.max_tokens:  # a timed run's shortened first requests: not
            latency, ttft = time.perf_counter() - started, ttft or 0.0  # in the latency figures
            run.latencies.append(latency)
            run.ttfts.append(ttft)
            run.tpots.append((latency - ttft) / max(1, len(token_ids) - 1))
        if stats is not None:
            run.observe(stats)
    return True


def sweep(
    clients: Clients,
    workloads: dict[str, list[Prompt]],
    concurrencies: list[int],
    max_tokens: int,
    requests_per_client: int,
    log: bool = True,
    temperature: float = 0.0,
    modes: tuple[str, ...] = DEFAULT_MODES,
    repeats: int = 1,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
    compared: list[Compared] | None = None,
    peers: Peers | None = None,
) -> list[dict]:
    """Every mode at every concurrency for every workload; per (workload, concurrency) the modes take turns
    `repeats` times, every other time in reverse order (on a shared machine the speed drifts: taking turns
    spreads the drift over all modes, and reversing cancels a steady one, which in the same order each time
    would favour the modes that run later when the machine speeds up); target-only is the reference,
    whether asked for or not, and its row comes first. The `peers`' modes take their turns after the served
    ones. `compared` collects each row with its run and the reference, for check_departures()."""
    rows = []
    order = _with_reference(modes)
    for category, prompts in workloads.items():
        for concurrency in concurrencies:
            runs: dict[str, LoadRun] = {}
            with peers(prompts, concurrency) if peers is not None else nullcontext({}) as sends:
                schedule = order + list(sends)
                for repeat in range(repeats):
                    for mode in schedule if repeat % 2 == 0 else schedule[::-1]:
                        run = run_load(
                            clients, mode, concurrency, prompts, max_tokens, requests_per_client, category,
                            temperature, repeat, duration_s, warmup_s, send=sends.get(mode),
                        )  # fmt: skip
                        if mode in runs:
                            runs[mode].merge(run)
                        else:
                            runs[mode] = run
            reference = runs["target-only"]
            for run in runs.values():
                rows.append(run.summary(reference))
                if compared is not None:
                    compared.append((rows[-1], run, reference))
                if log:
                    print(format_row(rows[-1]), flush=True)
    return rows


def rate_sweep(
    clients: Clients,
    prompts: list[Prompt],
    request_rates: list[float],
    max_tokens: int,
    num_requests: int,
    log: bool = True,
    temperature: float = 0.0,
    category: str = "code",
    modes: tuple[str, ...] = DEFAULT_MODES,
    compared: list[Compared] | None = None,
) -> list[dict]:
    """Every mode at every request rate (the same arrival times for every mode); `compared` as for sweep()."""
    rows = []
    for rate in request_rates:
        reference = None
        for mode in _with_reference(modes):
            run = run_rate(clients, mode, rate, prompts, max_tokens, num_requests, category, temperature)
            reference = reference or run
            rows.append(run.summary(reference))
            if compared is not None:
                compared.append((rows[-1], run, reference))
            if log:
                print(format_row(rows[-1]), flush=True)
    return rows


def check_departures(target: LoadedModel, compared: list[Compared], log: bool = True) -> int:
    """Greedy runs: every output, target-only's included, against target-only decoding at batch 1 (done
    here once per prompt, the target loaded in this process). Where one departs, was it at a near-tie of
    the target's top two logits (batched and bfloat16 passes may round either way there, and nowhere
    else)? Adds `departures`, `near_tie_departures` and `divergences` to each row; returns how many
    departures were not near-ties (a lossless server has none)."""
    from tqdm import tqdm

    from specserve.bench.lossless import ReferenceDecoder, first_difference, first_divergence

    checked = [(row, run) for row, run, _ in compared if run.temperature == 0]
    token_ids: dict[Prompt, list[int]] = {}
    lengths: dict[Prompt, int] = {}  # the longest output to check per prompt
    for _, run in checked:
        for key, output in run.outputs.items():
            prompt = run.prompts[key]
            lengths[prompt] = max(lengths.get(prompt, 0), len(output))
    decoder = ReferenceDecoder(target)
    greedy: dict[Prompt, list[int]] = {}
    with tqdm(total=sum(lengths.values()), desc="batch-1 target-only", unit="tok", disable=not log) as bar:
        for prompt, length in lengths.items():
            token_ids[prompt], greedy[prompt] = prompt_token_ids(target.tokenizer, prompt), []
            for _ in range(length):  # one pass per token on the decoder's cache
                greedy[prompt].append(int(decoder.logits(token_ids[prompt], greedy[prompt]).argmax()))
                bar.update()
    departing = []  # (prompt, position, output, row)
    for row, run in checked:
        row["divergences"] = []
        for key, output in run.outputs.items():
            prompt = run.prompts[key]
            position = first_difference(greedy[prompt][: len(output)], output)
            if position is not None:
                departing.append((prompt, position, output, row))
    departing.sort(key=lambda d: (d[0], -d[1]))  # per prompt, later places first: each costs one pass
    for prompt, _, output, row in departing:
        divergence = first_divergence(decoder, token_ids[prompt], greedy[prompt][: len(output)], output)
        assert divergence is not None  # it departs
        row["divergences"].append(divergence.to_dict())
    real = 0
    for row, _ in checked:
        row["departures"] = len(row["divergences"])
        row["near_tie_departures"] = sum(d["near_tie"] for d in row["divergences"])
        real += row["departures"] - row["near_tie_departures"]
        if log:
            print(f"{row['category']:18} {_load_label(row):7} {row['mode']:12} departures from batch-1 target-only "
                  f"{row['departures']}, at near-ties {row['near_tie_departures']}", flush=True)  # fmt: skip
    return real


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """As the orchestrator tokenizes the request a served mode sends (the server has checked its length)."""
    from specserve.config import GenerationRequest
    from specserve.prompts import tokenize_request

    text, chat = prompt
    request = GenerationRequest(messages=(("user", text),)) if chat else GenerationRequest(prompt=text)
    return tokenize_request(tokenizer, request, sys.maxsize, sys.maxsize)


def _with_reference(modes: tuple[str, ...]) -> list[str]:
    for mode in modes:
        parse_mode(mode)  # refuse a bad name before anything runs
    return ["target-only"] + [m for m in modes if m != "target-only"]


def format_row(row: dict) -> str:
    acceptance = "" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.2f}"
    turns = row.get("tokens_per_second_by_turn", [])
    return (
        f"{row['category']:18} {_load_label(row):7} prompt {row['mean_prompt_tokens']:5.0f}  "
        f"{row['mode']:21} {row['tokens_per_second']:7.2f} tok/s ({'/'.join(f'{t:.1f}' for t in turns)})  "
        f"p50 {_figure(row['latency_p50_s'], '6.2f')}s p99 {_figure(row['latency_p99_s'], '6.2f')}s  "
        f"ttft {_figure(row['ttft_p50_ms'], '6.0f')} ms  tpot {_figure(row['tpot_ms'], '6.0f')} ms  "
        f"accept {acceptance:4}  k {row['mean_k']:4.1f}  "
        f"eff {_fraction(row['efficiency'])} hidden {_fraction(row['draft_hidden_fraction'])}  "
        f"identical {row['identical_to_target_only']}/{row['compared_to_target_only']}  errors {row['errors']}"
    )


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _fraction(value: float | None) -> str:
    return "  -" if value is None else f"{value:.2f}"


def _load_label(row: dict) -> str:
    return f"{row['request_rate']:g}/s" if row.get("request_rate") else f"c={row['concurrency']}"


def _add_counts(totals: list[int], counts: Sequence[int]) -> None:
    totals.extend([0] * (len(counts) - len(totals)))
    for i, count in enumerate(counts):
        totals[i] += count


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
