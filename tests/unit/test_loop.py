"""The pure speculative loop over scripted Drafter/Verifier classes: no models, exact expectations."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from specserve.core.loop import GenerationResult, SpeculativeDecoder, StopConditions, speculative_generate
from specserve.core.types import Proposal, SamplingParams, Verdict

VOCAB = 50
EOS = VOCAB - 1  # the base rule never produces it; only rules built by eos_at() do
PROMPT = (3, 1, 4, 1, 5)
GREEDY = SamplingParams()
Rule = Callable[[Sequence[int]], int]


def base_rule(context: Sequence[int]) -> int:
    """The scripted target's next token: a deterministic function of the whole context."""
    return (7 * sum(context) + 3 * len(context) + context[-1] * context[-1]) % (VOCAB - 1)


def eos_at(index: int, rule: Rule = base_rule) -> Rule:
    """The rule, except the generated token at `index` is EOS."""
    return lambda context: EOS if len(context) - len(PROMPT) == index else rule(context)


def decode(token_ids: Sequence[int]) -> str:
    return "".join(chr(97 + i % 26) for i in token_ids)


class ScriptedTarget:
    """Verifier: greedy verification against `rule`; its context advances by each verdict."""

    def __init__(self, rule: Rule = base_rule, max_context: int = 10_000) -> None:
        self.rule, self.max_context = rule, max_context
        self.context = list(PROMPT)

    def verify(self, proposal: Proposal, sampling: SamplingParams) -> Verdict:
        k = len(proposal.token_ids)
        # it scores positions len(context) - 1 .. len(context) + k - 1; a model has max_context positions
        assert len(self.context) + k <= self.max_context, (len(self.context), k, self.max_context)
        num_accepted = 0
        while num_accepted < k and proposal.token_ids[num_accepted] == self.rule(
            self.context + proposal.token_ids[:num_accepted]
        ):
            num_accepted += 1
        token_ids = proposal.token_ids[:num_accepted] + [self.rule(self.context + proposal.token_ids[:num_accepted])]
        self.context += token_ids
        return Verdict(token_ids, num_accepted)


class ScriptedDraft:
    """Drafter: proposes what `rule` says, except a wrong token at the generated positions in `wrong_at`."""

    def __init__(self, rule: Rule = base_rule, wrong_at: Sequence[int] = ()) -> None:
        self.rule, self.wrong_at = rule, set(wrong_at)
        self.context = list(PROMPT)
        self.requested_k: list[int] = []

    def propose(self, k: int, sampling: SamplingParams) -> Proposal:
        self.requested_k.append(k)
        start = len(self.context)
        for _ in range(k):
            token_id = self.rule(self.context)
            if len(self.context) - len(PROMPT) in self.wrong_at:
                token_id = (token_id + 1) % (VOCAB - 1)
            self.context.append(token_id)
        return Proposal(self.context[start:])

    def commit(self, num_kept: int, new_token_ids: list[int]) -> None:
        assert num_kept <= len(self.context), (num_kept, len(self.context))
        del self.context[num_kept:]
        self.context += new_token_ids


def target_only(rule: Rule, max_tokens: int, max_context: int = 10_000) -> list[int]:
    """The reference, written without the loop: one rule() per token until EOS or a limit."""
    context, out = list(PROMPT), []
    while len(out) < max_tokens and len(context) < max_context:
        out.append(rule(context))
        context.append(out[-1])
        if out[-1] == EOS:
            break
    return out


def run(
    k: int,
    *,
    rule: Rule = base_rule,
    wrong_at: Sequence[int] = (),
    max_tokens: int = 30,
    stop: tuple[str, ...] = (),
    max_context: int = 10_000,
) -> tuple[GenerationResult, list[list[int]], ScriptedDraft, ScriptedTarget]:
    """Run the decoder; return the result, the chunks rounds() yielded, and both scripted sides."""
    draft, target = ScriptedDraft(rule, wrong_at), ScriptedTarget(rule, max_context)
    decoder = SpeculativeDecoder(
        draft if k else None,
        target,
        num_prompt_tokens=len(PROMPT),
        k=k,
        sampling=GREEDY,
        stop=StopConditions(max_tokens, frozenset({EOS}), stop),
        max_context=max_context,
        decode=decode,
    )
    chunks = list(decoder.rounds())
    result = decoder.result
    assert [t for chunk in chunks for t in chunk] == result.token_ids, "streamed chunks must add up to the result"
    return result, chunks, draft, target


KS = [0, 1, 2, 4, 8]
WRONG = [(), (0,), (2, 9), (1, 2, 3, 4, 5), tuple(range(0, 30, 3))]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("wrong_at", WRONG)
def test_output_equals_target_only(k: int, wrong_at: tuple[int, ...]) -> None:
    result, _, _, target = run(k, wrong_at=wrong_at)
    expected = target_only(base_rule, 30)
    assert result.token_ids == expected, f"k={k}, draft wrong at {wrong_at}"
    assert result.finish_reason == "length"
    assert result.text == decode(expected)
    assert target.context == list(PROMPT) + expected, "the verifier's context must hold exactly the output"


def test_speculative_generate_is_the_decoder_run() -> None:
    result = speculative_generate(
        ScriptedDraft(wrong_at=(2,)),
        ScriptedTarget(),
        num_prompt_tokens=len(PROMPT),
        k=3,
        sampling=GREEDY,
        stop=StopConditions(12),
        max_context=10_000,
    )
    assert result.token_ids == target_only(base_rule, 12) and result.finish_reason == "length"
    assert result.text == "", "no decode function, no text"


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("wrong_at", [(), "eos"])
def test_eos_stops_right_after_the_eos(k: int, wrong_at: tuple[int, ...] | str) -> None:
    num_mid_round = 0
    for index in range(12):
        rule = eos_at(index)
        draft_wrong = (index,) if wrong_at == "eos" else wrong_at  # "eos": EOS is the recovered token
        result, _, _, target = run(k, rule=rule, wrong_at=draft_wrong)
        expected = target_only(rule, 30)
        assert expected[-1] == EOS and len(expected) == index + 1
        assert result.token_ids == expected, f"EOS at {index}, k={k}: the EOS is kept and nothing follows it"
        assert result.finish_reason == "eos"
        assert result.text == decode(expected[:-1]), "the text excludes the EOS"
        num_mid_round += len(target.context) > len(PROMPT) + index + 1  # the verdict went past the EOS
    if k >= 2 and wrong_at == ():
        assert num_mid_round > 0, "no case put the EOS mid-round; the test lost its point"


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("wrong_at", [(), (2, 9)])
def test_max_tokens_mid_round_truncates_exactly(k: int, wrong_at: tuple[int, ...]) -> None:
    for max_tokens in range(1, 20):
        result, _, draft, target = run(k, wrong_at=wrong_at, max_tokens=max_tokens)
        assert result.token_ids == target_only(base_rule, max_tokens), f"max_tokens={max_tokens}, k={k}"
        assert result.finish_reason == "length"
        assert len(target.context) == len(PROMPT) + max_tokens, "the verifier was asked past max_tokens"


def test_max_tokens_shrinks_the_last_proposal() -> None:
    result, _, draft, _ = run(4, max_tokens=7)
    assert draft.requested_k == [4, 1], "5 tokens in the first round leave room for 2: one draft + the bonus"
    assert result.stats.num_proposed == 5


@pytest.mark.parametrize("k", KS)
def test_stop_string_cuts_the_text_and_emits_nothing_past_it(k: int) -> None:
    expected_ids = target_only(base_rule, 40)
    full_text = decode(expected_ids)
    for start in range(0, 25):
        stop = full_text[start : start + 3]
        position = full_text.find(stop)
        result, _, _, _ = run(k, wrong_at=(2, 9), max_tokens=40, stop=(stop,))
        assert result.finish_reason == "stop", f"stop={stop!r}, k={k}"
        assert result.text == full_text[:position], f"stop={stop!r}, k={k}: the text ends before the stop string"
        assert result.token_ids == expected_ids[: position + len(stop)], (
            f"stop={stop!r}, k={k}: tokens up to the end of the stop string, nothing after"
        )


@pytest.mark.parametrize("k", KS)
def test_the_earliest_stop_string_wins(k: int) -> None:
    expected_ids = target_only(base_rule, 40)
    full_text = decode(expected_ids)
    early, late = full_text[2:4], full_text[5:8]  # both inside the first round when k >= 7
    assert full_text.find(early) < full_text.find(late)
    result, _, _, _ = run(k, max_tokens=40, stop=(late, early))
    assert result.text == full_text[: full_text.find(early)], result.text
    assert result.finish_reason == "stop"


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("max_context", [6, 7, 20, 23])
def test_max_context_ends_with_length(k: int, max_context: int) -> None:
    result, _, _, target = run(k, wrong_at=(1,), max_tokens=100, max_context=max_context)
    assert result.token_ids == target_only(base_rule, 100, max_context), f"k={k}, max_context={max_context}"
    assert len(PROMPT) + len(result.token_ids) == max_context
    assert result.finish_reason == "length"


def test_prompt_filling_the_context_generates_nothing() -> None:
    result, chunks, _, _ = run(4, max_context=len(PROMPT))
    assert result.token_ids == [] and chunks == [] and result.finish_reason == "length"


# ---------------------------------------------------------------------------------------------------
# stats


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_stats_when_the_draft_is_the_target(k: int) -> None:
    num_rounds = 5
    result, chunks, _, _ = run(k, max_tokens=num_rounds * (k + 1))
    stats = result.stats
    assert [len(c) for c in chunks] == [k + 1] * num_rounds
    assert stats.acceptance_rate == 1.0
    assert stats.mean_acceptance_length == k + 1, "every round emits k accepted drafts + the bonus"
    assert (stats.num_rounds, stats.num_proposed, stats.num_accepted) == (num_rounds, num_rounds * k, num_rounds * k)
    assert stats.accepted_at_position == stats.proposed_at_position == [num_rounds] * k
    assert stats.num_generated == num_rounds * (k + 1)


def test_stats_with_rejections_by_hand() -> None:
    # k = 4, 15 tokens, drafts wrong at generated positions 2 and 9:
    #   round 1 proposes 0..3, rejects 2: emits 0, 1 + recovered 2       (accepted 2)
    #   round 2 proposes 3..6, all right:  emits 3..6 + bonus 7          (accepted 4)
    #   round 3 proposes 8..11, rejects 9: emits 8 + recovered 9         (accepted 1)
    #   round 4 proposes 10..13:           emits 10..13 + bonus 14       (accepted 4)
    result, chunks, draft, _ = run(4, wrong_at=(2, 9), max_tokens=15)
    stats = result.stats
    assert [len(c) for c in chunks] == [3, 5, 2, 5]
    assert draft.requested_k == [4, 4, 4, 4]
    assert (stats.num_rounds, stats.num_proposed, stats.num_accepted) == (4, 16, 11)
    assert stats.proposed_at_position == [4, 4, 4, 4]
    assert stats.accepted_at_position == [4, 3, 2, 2]
    assert stats.acceptance_rate == 11 / 16
    assert stats.mean_acceptance_length == 15 / 4
    assert stats.mean_accepted_per_round == 11 / 4
    assert stats.num_generated == 15


def test_stats_target_only() -> None:
    result, chunks, _, _ = run(0, max_tokens=9)
    stats = result.stats
    assert [len(c) for c in chunks] == [1] * 9
    assert (stats.num_rounds, stats.num_proposed, stats.num_accepted) == (9, 0, 0)
    assert stats.mean_acceptance_length == 1.0 and stats.acceptance_rate == 0.0
    assert stats.accepted_at_position == []


# ---------------------------------------------------------------------------------------------------
# argument errors


def test_invalid_arguments_raise_value_error() -> None:
    common = dict(num_prompt_tokens=len(PROMPT), sampling=GREEDY, max_context=100)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeDecoder(ScriptedDraft(), ScriptedTarget(), k=-1, stop=StopConditions(5), **common)
    with pytest.raises(ValueError, match="draft"):
        SpeculativeDecoder(None, ScriptedTarget(), k=2, stop=StopConditions(5), **common)
    with pytest.raises(ValueError, match="decode"):
        SpeculativeDecoder(ScriptedDraft(), ScriptedTarget(), k=2, stop=StopConditions(5, stop=("x",)), **common)
    with pytest.raises(ValueError, match="max_tokens"):
        StopConditions(0)
    with pytest.raises(ValueError, match="non-empty"):
        StopConditions(5, stop=("",))


# ---------------------------------------------------------------------------------------------------
# streamed text


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("case", ["length", "eos", "stop"])
def test_text_deltas_add_up_to_the_final_text(k: int, case: str) -> None:
    full_text = decode(target_only(base_rule, 30))
    rule = eos_at(17) if case == "eos" else base_rule
    stops = (full_text[12:15], "zzzzz") if case == "stop" else ("zzzzz",)  # "zzzzz" never occurs: held-back suffixes
    decoder = SpeculativeDecoder(
        ScriptedDraft(rule, wrong_at=(2, 9)) if k else None,
        ScriptedTarget(rule),
        num_prompt_tokens=len(PROMPT),
        k=k,
        sampling=GREEDY,
        stop=StopConditions(30, frozenset({EOS}), stops),
        max_context=10_000,
        decode=decode,
    )
    streamed = ""
    for _ in decoder.rounds():
        streamed += decoder.text_delta()
        assert full_text.startswith(streamed), f"streamed text {streamed!r} is not final: it left the output's path"
    streamed += decoder.text_delta()
    result = decoder.result
    assert result.finish_reason == case
    assert streamed == result.text, f"{case}, k={k}: deltas {streamed!r} != final text {result.text!r}"
    if case == "stop":
        assert stops[0] not in streamed and streamed == full_text[: full_text.find(stops[0])]
