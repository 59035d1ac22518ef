"""Greedy speculative output equals target-only output exactly (tiny models, fp32, CPU, batch 1)."""

from __future__ import annotations

import dataclasses
import random

import pytest

import target_service.worker
from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.core.loop import GenerationResult
from specserve.core.types import Verdict
from specserve.models import tiny
from specserve.models.loading import LoadedModel
from specserve.models.registry import TinySpec, get_preset

EOS = 258  # <|im_end|> in the tiny byte vocabulary
MAX_TOKENS = 40
KS = [1, 2, 4, 8]
LONG_PROMPT = tuple(random.Random(0).randrange(256) for _ in range(500))  # 12 tokens short of the 512 context
PROMPTS: dict[str, GenerationRequest] = {
    name: GenerationRequest(max_tokens=MAX_TOKENS, **fields)
    for name, fields in {
        "def": {"prompt": "def f("},
        "hello": {"prompt": "hello world"},
        "import": {"prompt": "import os\n"},
        "x": {"prompt": "x"},
        "class": {"prompt": "class A:"},
        "for": {"prompt": "for i in range(10):\n"},
        "spaces": {"prompt": "  "},
        "newlines": {"prompt": "\n\n"},
        "return": {"prompt": "return a + b"},
        "shebang": {"prompt": "#!/usr/bin/env python\n"},
        "fox": {"prompt": "The quick brown fox"},
        "digits": {"prompt": "0123456789"},
        "one-token": {"prompt_token_ids": (5,)},
        "special-tokens": {"prompt_token_ids": (257, 115, 121, 115, 10, 258, 257)},
        "near-context-limit": {"prompt_token_ids": LONG_PROMPT},
        "one-slot-left": {"prompt_token_ids": tuple(random.Random(1).randrange(256) for _ in range(511))},
    }.items()
}


def with_k(request: GenerationRequest, k: int, **changes: object) -> GenerationRequest:
    return dataclasses.replace(request, num_speculative_tokens=k, **changes)


@pytest.fixture(scope="module")
def target_only(engine: SpeculativeEngine) -> dict[str, GenerationResult]:
    return {name: engine.generate(with_k(request, 0)) for name, request in PROMPTS.items()}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", list(PROMPTS))
def test_output_is_invariant_in_k(
    engine: SpeculativeEngine, target_only: dict[str, GenerationResult], name: str, k: int
) -> None:
    expected = target_only[name]
    result = engine.generate(with_k(PROMPTS[name], k))
    assert result.token_ids == expected.token_ids, f"{name}, k={k}: speculative output differs from target-only"
    assert (result.finish_reason, result.text) == (expected.finish_reason, expected.text)
    if len(expected.token_ids) > 1:  # with room for one token only, there is nothing to draft
        assert result.stats.num_proposed > 0, "k > 0 must propose drafts"


def test_the_prompt_set_covers_eos_length_and_the_context_limit(target_only: dict[str, GenerationResult]) -> None:
    reasons = {name: result.finish_reason for name, result in target_only.items()}
    assert "eos" in reasons.values() and "length" in reasons.values(), reasons
    assert len(target_only["one-slot-left"].token_ids) == 1, "a 511-token prompt leaves room for one token"
    limit = target_only["near-context-limit"]
    assert limit.finish_reason == "length" and len(limit.token_ids) == 512 - len(LONG_PROMPT), (
        "the 512-token context, not max_tokens, must end the long prompt"
    )


def test_eos_mid_round_matches_target_only(
    engine: SpeculativeEngine, target_only: dict[str, GenerationResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    verdicts: list[Verdict] = []
    verify = target_service.worker.TargetSession.verify

    def recording_verify(self, proposal, sampling):  # type: ignore[no-untyped-def]
        verdicts.append(verify(self, proposal, sampling))
        return verdicts[-1]

    monkeypatch.setattr(target_service.worker.TargetSession, "verify", recording_verify)
    eos_names = [name for name, result in target_only.items() if result.finish_reason == "eos"]
    assert len(eos_names) >= 3, eos_names
    mid_round = []
    for name in eos_names:
        expected = target_only[name]
        assert expected.token_ids[-1] == EOS and EOS not in expected.token_ids[:-1]
        for k in KS:
            verdicts.clear()
            result = engine.generate(with_k(PROMPTS[name], k))
            assert result.token_ids == expected.token_ids, f"{name}, k={k}"
            assert result.finish_reason == "eos"
            assert result.text == engine.decode(result.token_ids[:-1]) and "<|im_end|>" not in result.text
            last = verdicts[-1].token_ids
            if EOS in last and last.index(EOS) < len(last) - 1:
                mid_round.append((name, k))
    assert mid_round, "no request hit the EOS mid-round: the trimming path went untested"


def test_draft_equal_to_target_accepts_everything(tiny_target: LoadedModel) -> None:
    same = SpeculativeEngine(tiny_target, tiny_target)
    for k in KS:
        num_rounds = 6
        request = GenerationRequest(prompt="def f(", max_tokens=num_rounds * (k + 1), num_speculative_tokens=k)
        result = same.generate(request)
        baseline = same.generate(with_k(request, 0))
        assert result.finish_reason == "length", "an EOS would cut the last round short"
        assert result.token_ids == baseline.token_ids
        assert result.stats.acceptance_rate == 1.0, f"k={k}: {result.stats.acceptance_rate}"
        assert result.stats.mean_acceptance_length == k + 1, f"k={k}: {result.stats.mean_acceptance_length}"
        assert result.stats.num_rounds == num_rounds


def test_unrelated_random_draft_is_rejected_but_lossless(
    tiny_target: LoadedModel, target_only: dict[str, GenerationResult]
) -> None:
    preset = get_preset("tiny")
    assert preset is not None and isinstance(preset.source, TinySpec)
    unrelated = tiny.build_model(dataclasses.replace(preset.source, seed=999, num_layers=1))
    draft = dataclasses.replace(tiny_target, name="tiny-unrelated", model=unrelated)
    random_engine = SpeculativeEngine(tiny_target, draft)
    num_proposed = num_accepted = 0
    for name in ("def", "hello", "for", "fox"):
        result = random_engine.generate(with_k(PROMPTS[name], 4))
        assert result.token_ids == target_only[name].token_ids, name
        num_proposed += result.stats.num_proposed
        num_accepted += result.stats.num_accepted
    assert num_accepted / num_proposed < 0.1, f"an unrelated draft got {num_accepted}/{num_proposed} accepted"


def test_the_correlated_draft_is_neither_always_right_nor_always_wrong(engine: SpeculativeEngine) -> None:
    result = engine.generate(with_k(PROMPTS["def"], 4))
    assert 0.1 < result.stats.acceptance_rate < 0.95, result.stats.acceptance_rate


def test_engine_without_draft_is_target_only(
    tiny_target: LoadedModel, target_only: dict[str, GenerationResult]
) -> None:
    alone = SpeculativeEngine(tiny_target, None, num_speculative_tokens=4)
    assert alone.generate(PROMPTS["def"]).token_ids == target_only["def"].token_ids
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        alone.generate(with_k(PROMPTS["def"], 2))


@pytest.mark.parametrize("name", ["def", "for", "fox"])
def test_stop_strings_are_invariant_in_k(
    engine: SpeculativeEngine, target_only: dict[str, GenerationResult], name: str
) -> None:
    text = target_only[name].text
    usable = [text[j : j + 2] for j in range(len(text) - 1) if "\ufffd" not in text[j : j + 2]]  # no partial UTF-8
    stops = usable[:: max(1, len(usable) // 6)][:6]
    assert len(stops) >= 3, f"too few usable stop strings in {text!r}"
    for stop in stops:
        position = text.find(stop)
        expected = engine.generate(with_k(PROMPTS[name], 0, stop=(stop,)))
        assert (expected.finish_reason, expected.text) == ("stop", text[:position]), f"k=0, stop={stop!r}"
        for k in (1, 4, 8):
            result = engine.generate(with_k(PROMPTS[name], k, stop=(stop,)))
            assert result.token_ids == expected.token_ids, f"{name}, stop={stop!r}, k={k}"
            assert (result.finish_reason, result.text) == ("stop", expected.text), f"{name}, stop={stop!r}, k={k}"


def test_a_prompt_filling_the_context_is_refused(engine: SpeculativeEngine) -> None:
    with pytest.raises(ValueError, match="context holds 512"):
        engine.generate(GenerationRequest(prompt_token_ids=(7,) * 512, max_tokens=4))
