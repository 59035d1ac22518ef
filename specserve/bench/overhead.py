"""The served stack's host overhead: a round's wall time less the draft's and the target's forward passes
that it waited for (as the workers time them), i.e. what gRPC, protobuf, Python and queueing add per round.
`specserve bench overhead` measures it for target-only and fixed k at several client counts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specserve.core.stats import SpeculationStats

DEFAULT_PROMPTS = (
    "def fibonacci(n):",
    "Translate into French: 'The train to Lyon leaves at eight o'clock from platform four.'",
    "Why is the sky blue? Answer in a short paragraph.",
    "A shop sells pens at 3 for $2. How much do 18 pens cost? Show your working.",
)
"""Short prompts, so that long outputs fit small contexts (the tiny test models hold 512 tokens)."""


@dataclass(frozen=True, slots=True)
class HostOverhead:
    """Requests' rounds together: their wall time and the passes on their critical path."""

    num_rounds: int
    wall_s: float
    """Each request's wall time as its client saw it, less its time to first token (the prefill's)."""
    pass_s: float
    """The forward passes the rounds waited for: the draft's proposals and the target's verifications
    (a batched pass counts in full for every session in it: each waited for all of it)."""

    @classmethod
    def of(cls, requests: Iterable[tuple[float, SpeculationStats]]) -> HostOverhead:
        """From (the client's wall seconds, the request's stats) per request."""
        num_rounds, wall_s, pass_s = 0, 0.0, 0.0
        for seconds, stats in requests:
            num_rounds += stats.num_rounds
            wall_s += seconds - stats.time_to_first_token_s
            pass_s += stats.draft_pass_s + stats.target_pass_s
        return cls(num_rounds, wall_s, pass_s)

    @property
    def wall_ms_per_round(self) -> float:
        return 1000 * self.wall_s / self.num_rounds if self.num_rounds else 0.0

    @property
    def pass_ms_per_round(self) -> float:
        return 1000 * self.pass_s / self.num_rounds if self.num_rounds else 0.0

    @property
    def host_ms_per_round(self) -> float:
        return self.wall_ms_per_round - self.pass_ms_per_round


def stats_from_proto(s: Any) -> SpeculationStats:
    """The figures of a GenerationStats message that host overhead and the bench's tables use."""
    return SpeculationStats(
        num_proposed=s.proposed,
        num_accepted=s.accepted,
        num_rounds=s.rounds,
        num_rejections=s.rejections,
        draft_s=s.draft_ms / 1000,
        target_s=s.target_ms / 1000,
        transport_s=s.transport_ms / 1000,
        time_to_first_token_s=s.time_to_first_token_ms / 1000,
        draft_pass_s=s.draft_pass_ms / 1000,
        target_pass_s=s.target_pass_ms / 1000,
        proposed_by_source=dict(s.proposed_by_source),
        accepted_by_source=dict(s.accepted_by_source),
    )


def measure(
    address: str, k: int, num_clients: int, max_tokens: int, requests_per_client: int,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
) -> HostOverhead:  # fmt: skip
    """`num_clients` closed-loop clients (a channel each) send greedy requests at fixed k (0: target-only),
    generating exactly max_tokens, `requests_per_client` each, all starting together."""
    from specserve_client import SpecServeClient

    results: list[tuple[float, SpeculationStats]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(num_clients)

    def client_loop(index: int) -> None:
        try:
            with SpecServeClient(address) as client:
                start.wait()
                for i in range(requests_per_client):
                    prompt = prompts[(index + i) % len(prompts)]
                    started = time.perf_counter()
                    response = client.generate(prompt, max_tokens=max_tokens, num_speculative_tokens=k, ignore_eos=True)
                    results.append((time.perf_counter() - started, stats_from_proto(response.stats)))
        except BaseException as error:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(error)
            start.abort()

    threads = [threading.Thread(target=client_loop, args=(i,), name=f"overhead-client-{i}") for i in range(num_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return HostOverhead.of(results)


def overhead_rows(
    address: str, ks: Sequence[int], concurrency: Sequence[int], max_tokens: int, requests_per_client: int,
    repeats: int = 1,
) -> list[dict]:  # fmt: skip
    """One row per (clients, k); the modes take turns `repeats` times per load and their figures are pooled."""
    rows = []
    measure(address, 0, 1, min(max_tokens, 16), 1)  # warm-up: first calls pay one-off allocations
    for num_clients in concurrency:
        pooled: dict[int, list[HostOverhead]] = {k: [] for k in ks}
        for _ in range(repeats):
            for k in ks:
                pooled[k].append(measure(address, k, num_clients, max_tokens, requests_per_client))
        for k in ks:
            total = HostOverhead(
                sum(o.num_rounds for o in pooled[k]), sum(o.wall_s for o in pooled[k]), sum(o.pass_s for o in pooled[k])
            )
            rows.append({
                "clients": num_clients, "k": k, "rounds": total.num_rounds,
                "wall_ms_per_round": round(total.wall_ms_per_round, 3),
                "pass_ms_per_round": round(total.pass_ms_per_round, 3),
                "host_overhead_ms_per_round": round(total.host_ms_per_round, 3),
            })  # fmt: skip
    return rows


def format_rows(rows: list[dict]) -> str:
    head = "  ".join(
        (f"{'clients':>7}", f"{'mode':<11}", f"{'rounds':>6}", "wall ms/round", "passes ms/round", "host ms/round")
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        mode = "target-only" if row["k"] == 0 else f"k={row['k']}"
        lines.append(
            f"{row['clients']:>7}  {mode:<11}  {row['rounds']:>6}  {row['wall_ms_per_round']:>13.2f}  "
            f"{row['pass_ms_per_round']:>15.2f}  {row['host_overhead_ms_per_round']:>13.2f}"
        )
    lines.append(
        "host ms/round = wall ms/round (each request's wall time at its client, less its time to first token) "
        "- passes ms/round (the draft's and the target's forward passes the round waited for, as the workers time them)"
    )
    return "\n".join(lines)


def overhead_figures(seconds: float, stats: SpeculationStats) -> dict[str, float]:
    """A bench mode's figures per round from its requests' summed wall seconds and summed stats."""
    passes = stats.draft_pass_s + stats.target_pass_s
    total = HostOverhead(stats.num_rounds, seconds - stats.time_to_first_token_s, passes)
    return {
        "wall_ms_per_round": round(total.wall_ms_per_round, 3),
        "pass_ms_per_round": round(total.pass_ms_per_round, 3),
        "host_overhead_ms_per_round": round(total.host_ms_per_round, 3),
    }
