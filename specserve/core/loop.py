"""The speculative loop: propose k, verify in one target pass, commit, until a stop condition.

It runs over the Drafter/Verifier protocols, so in-process workers and remote clients drive
the same code. k == 0 is target-only decoding through the same path (the benchmarks' baseline).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from specserve.core.stats import SpeculationStats
from specserve.core.types import Drafter, Proposal, SamplingParams, Verdict, Verifier

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True, slots=True)
class StopConditions:
    max_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()  # stop strings: generation ends before the first occurrence

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


@dataclass(slots=True)
class GenerationResult:
    token_ids: list[int] = field(default_factory=list)  # generated tokens only (an EOS is kept)
    text: str = ""  # decoded tokens, cut before a stop string, without the EOS
    finish_reason: str | None = None  # "length" | "stop" | "eos"
    stats: SpeculationStats = field(default_factory=SpeculationStats)


class SpeculativeDecoder:
    """One request's state: what to draft next (`next_k`), what a verified round emits (`apply`).

    `rounds()` drives it synchronously with the given drafter and verifier, yielding the tokens each
    round emits; drivers of their own (the pipelined orchestrator) pass None for both.
    """

    def __init__(
        self,
        drafter: Drafter | None,
        verifier: Verifier | None,
        *,
        num_prompt_tokens: int,
        k: int,
        sampling: SamplingParams,
        stop: StopConditions,
        max_context: int,
        decode: Decode | None = None,
        stats: SpeculationStats | None = None,
        started_at: float | None = None,
    ) -> None:
        if k < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {k}")
        if k > 0 and drafter is None and verifier is not None:
            raise ValueError("num_speculative_tokens > 0 needs a draft model")
        if stop.stop and decode is None:
            raise ValueError("stop strings need a decode function")
        self.drafter, self.verifier = drafter, verifier
        self.k, self.sampling, self.stop = k, sampling, stop
        self.decode = decode
        self.context_length = num_prompt_tokens
        self.max_context = max_context
        self.result = GenerationResult(stats=stats or SpeculationStats())
        self.started_at = time.perf_counter() if started_at is None else started_at
        self._num_text_emitted = 0

    def rounds(self) -> Iterator[list[int]]:
        """The synchronous driver: one propose and one verify per round."""
        assert self.verifier is not None, "rounds() needs a verifier"
        while (k := self.next_k()) is not None:
            t0 = time.perf_counter()
            proposal = self.drafter.propose(k, self.sampling) if k > 0 and self.drafter else Proposal([])
            t1 = time.perf_counter()
            verdict = self.verifier.verify(proposal, self.sampling)
            t2 = time.perf_counter()
            if self.drafter is not None:
                self.drafter.commit(self.context_length + verdict.num_accepted, verdict.token_ids[-1:])
            emitted = self.apply(proposal, verdict, t1 - t0, t2 - t1)
            if emitted:
                yield emitted

    def next_k(self) -> int | None:
        """The window for the next round (shrunk so nothing is drafted that could not be emitted),
        or None when the request is finished."""
        if self.result.finish_reason is not None:
            return None
        room = self.room()
        if room <= 0:
            self._finish("length")
            return None
        return min(self.k, room - 1)

    def room(self) -> int:
        """Tokens the request may still emit (its budget and the context's)."""
        return min(self.stop.max_tokens - len(self.result.token_ids), self.max_context - self.context_length)

    def apply(self, proposal: Proposal, verdict: Verdict, draft_s: float, target_s: float) -> list[int]:
        """Record one verified round; return the tokens it emits after EOS, length and stop-string trims."""
        self.result.stats.observe_round(
            len(proposal.token_ids), verdict.num_accepted, draft_s, target_s, proposal.source
        )
        return self._append(verdict.token_ids)

    def apply_run(self, token_ids: list[int]) -> list[int]:
        """Record tokens of a target-only run (a round each, no drafts) as they arrive; return what they emit
        (nothing once the request has finished: a run may decode past a stop string)."""
        if self.result.finish_reason is not None:
            return []
        for _ in token_ids:
            self.result.stats.observe_round(0, 0, 0.0, 0.0)
        return self._append(token_ids)

    def apply_first(self, token_id: int) -> list[int]:
        """Record the first output token, chosen by the target's prefill (no round); return what it emits."""
        return self._append([token_id])

    def _append(self, token_ids: list[int]) -> list[int]:
        self.context_length += len(token_ids)
        emitted = self._emit(token_ids)
        self.result.stats.observe_emitted(len(emitted), time.perf_counter() - self.started_at)
        return emitted

    def text_delta(self) -> str:
        """Text that became final since the last call: whole characters, never the start of a stop string."""
        if self.decode is None:
            return ""
        result = self.result
        if result.finish_reason is not None:
            text = result.text
        else:
            text = self.decode(result.token_ids).rstrip("\ufffd")  # a multi-byte character may be half generated
            text = text[: len(text) - _stop_prefix_overlap(text, self.stop.stop)]
        delta = text[self._num_text_emitted :]
        self._num_text_emitted = max(self._num_text_emitted, len(text))
        return delta

    def run(self) -> GenerationResult:
        for _ in self.rounds():
            pass
        return self.result

    def _emit(self, token_ids: list[int]) -> list[int]:
        """Append tokens, trimming at EOS, max_tokens and stop strings; return what was emitted."""
        result = self.result
        previous = len(result.token_ids)
        reason = None
        for i, token_id in enumerate(token_ids):
            if token_id in self.stop.eos_token_ids:
                token_ids, reason = token_ids[: i + 1], "eos"
                break
        room = self.stop.max_tokens - previous
        if len(token_ids) >= room:
            token_ids, reason = token_ids[:room], reason or "length"
        result.token_ids.extend(token_ids)
        if not (self.stop.stop and self._cut_at_stop_string(previous)) and reason is not None:
            self._finish(reason)
        return result.token_ids[previous:]

    def _finish(self, reason: str) -> None:
        result = self.result
        result.finish_reason = reason
        if self.decode is not None:
            result.text = self.decode(result.token_ids[:-1] if reason == "eos" else result.token_ids)

    def _cut_at_stop_string(self, previous: int) -> bool:
        """Finish with "stop" if a stop string appeared in the newly emitted text."""
        result = self.result
        assert self.decode is not None
        ids = result.token_ids
        if ids and ids[-1] in self.stop.eos_token_ids:
            ids = ids[:-1]
        text = self.decode(ids)
        # search a little before the old end: a stop string may straddle rounds, and a half-decoded
        # character can shift lengths by up to 3 replacement characters
        longest = max(len(s) for s in self.stop.stop)
        start = max(0, len(self.decode(result.token_ids[:previous])) - longest - 3)
        hits = [(pos, s) for s in self.stop.stop if (pos := text.find(s, start)) >= 0]
        if not hits:
            return False
        pos, s = min(hits)
        keep = previous  # the fewest tokens whose text reaches the end of the stop string
        while keep < len(ids) and len(self.decode(ids[:keep])) < pos + len(s):
            keep += 1
        del result.token_ids[keep:]
        result.finish_reason, result.text = "stop", text[:pos]
        return True


def _stop_prefix_overlap(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def speculative_generate(
    drafter: Drafter | None,
    verifier: Verifier,
    *,
    num_prompt_tokens: int,
    k: int,
    sampling: SamplingParams,
    stop: StopConditions,
    max_context: int,
    decode: Decode | None = None,
) -> GenerationResult:
    return SpeculativeDecoder(
        drafter,
        verifier,
        num_prompt_tokens=num_prompt_tokens,
        k=k,
        sampling=sampling,
        stop=stop,
        max_context=max_context,
        decode=decode,
    ).run()
