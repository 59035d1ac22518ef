"""The draft/target tokenizer check: identical passes; an added token, a changed id or vocab size fails loudly."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from inprocess.engine import SpeculativeEngine
from specserve.models import tiny
from specserve.models.loading import LoadedModel
from specserve.models.registry import TinySpec, get_preset
from specserve.models.tokenizers import TokenizerMismatchError, TokenizerSpec, check_compatible

VOCAB_SIZE = 260


def with_extra_token() -> PreTrainedTokenizerBase:
    tokenizer = tiny.build_tokenizer()
    tokenizer.add_tokens(["<|extra|>"])
    return tokenizer


def with_swapped_ids() -> PreTrainedTokenizerBase:
    """'a' and 'b' exchange ids: same vocabulary strings, different meaning of ids 97 and 98."""
    state = json.loads(tiny.build_tokenizer().backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def with_other_eos() -> PreTrainedTokenizerBase:
    tokenizer = tiny.build_tokenizer()
    tokenizer.eos_token = "<|endoftext|>"
    return tokenizer


def spec(tokenizer: PreTrainedTokenizerBase, vocab_size: int = VOCAB_SIZE) -> TokenizerSpec:
    return TokenizerSpec.of(tokenizer, vocab_size)


# (name, draft spec factory, substrings the message must contain)
MISMATCHES = [
    ("extra added token", lambda: spec(with_extra_token()), ["<|extra|>", "only in draft"]),
    ("changed vocab id", lambda: spec(with_swapped_ids()), ["different ids", "'a': draft 98 vs target 97"]),
    ("other eos token", lambda: spec(with_other_eos()), ["special tokens differ", "eos_token"]),
    ("model vocab size", lambda: spec(tiny.build_tokenizer(), VOCAB_SIZE + 1), ["vocab sizes differ", "261", "260"]),
]


def test_identical_tokenizers_pass() -> None:
    draft, target = spec(tiny.build_tokenizer()), spec(tiny.build_tokenizer())
    check_compatible(draft, target)
    assert draft.fingerprint() == target.fingerprint(), "independently built identical tokenizers must agree"


@pytest.mark.parametrize(("name", "make_draft", "must_mention"), MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_mismatch_raises_naming_the_difference(name, make_draft, must_mention) -> None:  # type: ignore[no-untyped-def]
    target = spec(tiny.build_tokenizer())
    draft = make_draft()
    with pytest.raises(TokenizerMismatchError) as caught:
        check_compatible(draft, target)
    assert isinstance(caught.value, ValueError), "a mismatch is a user error: ValueError"
    message = str(caught.value)
    for text in must_mention:
        assert text in message, f"{name}: {text!r} missing from {message!r}"
    assert draft.fingerprint() != target.fingerprint(), f"{name}: fingerprints must differ"


def test_engine_refuses_a_draft_with_another_tokenizer(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    for tokenizer, mention in ((with_extra_token(), "<|extra|>"), (with_swapped_ids(), "different ids")):
        draft = dataclasses.replace(tiny_draft, tokenizer=tokenizer)
        with pytest.raises(TokenizerMismatchError) as caught:
            SpeculativeEngine(tiny_target, draft)
        assert mention in str(caught.value)


def test_engine_refuses_a_draft_with_another_vocab_size(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    preset = get_preset("tiny-draft")
    assert preset is not None and isinstance(preset.source, TinySpec)
    model = tiny.build_model(dataclasses.replace(preset.source, vocab_size=VOCAB_SIZE + 4, derived_from=None))
    draft = dataclasses.replace(tiny_draft, model=model)
    with pytest.raises(TokenizerMismatchError, match="model vocab sizes differ: draft 264, target 260"):
        SpeculativeEngine(tiny_target, draft)


def test_engine_accepts_the_tiny_pair(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    assert spec(tiny_target.tokenizer).fingerprint() == spec(tiny_draft.tokenizer).fingerprint()
    SpeculativeEngine(tiny_target, tiny_draft)
