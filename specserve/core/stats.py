"""Per-request speculation statistics, filled by observe_*() as the loop runs.

Conventions: `acceptance_rate` = accepted / proposed drafts (vLLM's draft acceptance rate; a draft after
a rejection counts as proposed and not accepted). `per_token_acceptance` = accepted / (accepted +
rejections): the probability that a draft the target examines is accepted, the alpha of the speedup
formula. `mean_acceptance_length` counts the
tokens one round emits, so it includes the recovered-or-bonus token (vLLM's convention) and is
1.0 for target-only decoding; `mean_accepted_per_round` excludes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class SpeculationStats:
    num_prompt_tokens: int = 0
    num_generated: int = 0
    num_proposed: int = 0
    num_accepted: int = 0
    num_rounds: int = 0
    num_rejections: int = 0  # rounds that stopped at a rejected draft
    accepted_at_position: list[int] = field(default_factory=list)  # [i] = rounds whose draft i was accepted
    proposed_at_position: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    total_s: float = 0.0
    time_to_first_token_s: float = 0.0
    transport_s: float = 0.0  # served stack: waiting on internal calls (queues, turns) beyond the workers' compute
    draft_hidden_s: float = 0.0  # draft compute overlapped with verification whose window was used
    # served stack: the workers' forward passes the rounds waited for; wall time less these is host overhead
    draft_pass_s: float = 0.0
    target_pass_s: float = 0.0
    proposed_by_source: dict[str, int] = field(default_factory=dict)  # drafts per drafter ("model", "ngram")
    accepted_by_source: dict[str, int] = field(default_factory=dict)

    def observe_prefill(self, num_prompt_tokens: int, seconds: float) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.prefill_s += seconds

    def observe_round(self, k: int, num_accepted: int, draft_s: float, target_s: float, source: str = "") -> None:
        if k and source:
            self.proposed_by_source[source] = self.proposed_by_source.get(source, 0) + k
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + num_accepted
        self.num_rounds += 1
        self.num_proposed += k
        self.num_accepted += num_accepted
        self.num_rejections += num_accepted < k
        self.draft_s += draft_s
        self.target_s += target_s
        grow = k - len(self.proposed_at_position)
        if grow > 0:
            self.proposed_at_position.extend([0] * grow)
            self.accepted_at_position.extend([0] * grow)
        for i in range(k):
            self.proposed_at_position[i] += 1
            self.accepted_at_position[i] += i < num_accepted

    def observe_emitted(self, num_tokens: int, elapsed_s: float) -> None:
        if self.num_generated == 0 and num_tokens:
            self.time_to_first_token_s = elapsed_s
        self.num_generated += num_tokens
        self.total_s = elapsed_s

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def per_token_acceptance(self) -> float:
        examined = self.num_accepted + self.num_rejections
        return self.num_accepted / examined if examined else 0.0

    @property
    def mean_accepted_per_round(self) -> float:
        return self.num_accepted / self.num_rounds if self.num_rounds else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return (self.num_accepted + self.num_rounds) / self.num_rounds if self.num_rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated / self.total_s if self.total_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The public figures, named as in the API (GenerationStats in protos/specserve.proto)."""
        return {
            "proposed": self.num_proposed,
            "accepted": self.num_accepted,
            "rejections": self.num_rejections,
            "acceptance_rate": self.acceptance_rate,
            "rounds": self.num_rounds,
            "tokens_per_second": self.tokens_per_second,
            "time_to_first_token_ms": self.time_to_first_token_s * 1000,
            "mean_acceptance_length": self.mean_acceptance_length,
            "prompt_tokens": self.num_prompt_tokens,
            "generated_tokens": self.num_generated,
            "draft_ms": self.draft_s * 1000,
            "target_ms": self.target_s * 1000,
            "total_ms": self.total_s * 1000,
            "transport_ms": self.transport_s * 1000,
            "proposed_at_position": list(self.proposed_at_position),
            "accepted_at_position": list(self.accepted_at_position),
            "draft_hidden_ms": self.draft_hidden_s * 1000,
            "draft_pass_ms": self.draft_pass_s * 1000,
            "target_pass_ms": self.target_pass_s * 1000,
            "proposed_by_source": dict(self.proposed_by_source),
            "accepted_by_source": dict(self.accepted_by_source),
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in (
            "acceptance_rate",
            "per_token_acceptance",
            "mean_accepted_per_round",
            "mean_acceptance_length",
            "tokens_per_second",
        ):
            out[name] = getattr(self, name)
        return out
