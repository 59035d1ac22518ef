"""The draft/target tokenizer check: identical passes, whatever padding each model's logits carry; an added
token, a changed id, or a model with logits for fewer ids than its tokenizer has fails loudly."""

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

VOCAB_SIZE = 260  # the tiny models' logits width: 259 token ids and one padding row


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


def with_gguf_placeholders(padded_vocab_size: int) -> PreTrainedTokenizerBase:
    """As llama.cpp's GGUF conversion writes a padded vocabulary: `[PAD<id>]` for every id past the tokens."""
    state = json.loads(tiny.build_tokenizer().backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]  # a GGUF's token list holds every token, the special ones too
    vocab |= {added["content"]: added["id"] for added in state["added_tokens"]}
    vocab |= {f"[PAD{i}]": i for i in range(tiny.NUM_TOKEN_IDS, padded_vocab_size)}
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
    ("a model narrower than its tokenizer", lambda: spec(tiny.build_tokenizer(), 258),
     ["draft model has logits for 258 ids but its tokenizer has 259"]),
]  # fmt: skip


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
    if draft.vocab_size == target.vocab_size and draft.padded_vocab_size < draft.vocab_size:
        return  # the same tokenizer: the model's logits width is checked, not fingerprinted
    assert draft.fingerprint() != target.fingerprint(), f"{name}: fingerprints must differ"


@pytest.mark.parametrize(("draft_width", "target_width"), [(259, 640), (576, 640), (640, 260)])
def test_padded_logits_widths_pass_and_the_fingerprint_ignores_them(draft_width: int, target_width: int) -> None:
    """Qwen2.5-0.5B and 7B share a tokenizer of 151,665 ids with 151,936 and 152,064 logits: padding only."""
    draft, target = spec(tiny.build_tokenizer(), draft_width), spec(tiny.build_tokenizer(), target_width)
    check_compatible(draft, target)
    assert (draft.vocab_size, target.vocab_size) == (tiny.NUM_TOKEN_IDS, tiny.NUM_TOKEN_IDS)
    assert draft.fingerprint() == target.fingerprint()


def test_gguf_padding_placeholders_are_padding_not_tokens() -> None:
    """A tokenizer read from a GGUF lists `[PAD<id>]` up to the model's width (the 0.5B's to 151,935, the
    7B's to 152,063); the pair still has one tokenizer. A real token past the others still counts."""
    plain, draft, target = (tiny.build_tokenizer(), with_gguf_placeholders(576), with_gguf_placeholders(640))
    assert len(target) == 640 and target.convert_ids_to_tokens(600) == "[PAD600]"
    check_compatible(spec(draft, 576), spec(target, 640))
    assert spec(plain, 260).fingerprint() == spec(draft, 576).fingerprint() == spec(target, 640).fingerprint()
    with pytest.raises(TokenizerMismatchError, match="only in draft"):
        check_compatible(spec(with_extra_token(), 576), spec(target, 640))


def test_engine_refuses_a_draft_with_another_tokenizer(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    for tokenizer, mention in ((with_extra_token(), "<|extra|>"), (with_swapped_ids(), "different ids")):
        draft = dataclasses.replace(tiny_draft, tokenizer=tokenizer)
        with pytest.raises(TokenizerMismatchError) as caught:
            SpeculativeEngine(tiny_target, draft)
        assert mention in str(caught.value)


def test_engine_accepts_a_draft_with_other_padding_and_refuses_one_too_narrow(
    tiny_target: LoadedModel, tiny_draft: LoadedModel
) -> None:
    preset = get_preset("tiny-draft")
    assert preset is not None and isinstance(preset.source, TinySpec)
    for width in (VOCAB_SIZE + 64, tiny.NUM_TOKEN_IDS):  # more padding rows than the target's, and none
        model = tiny.build_model(dataclasses.replace(preset.source, vocab_size=width, derived_from=None))
        SpeculativeEngine(tiny_target, dataclasses.replace(tiny_draft, model=model))
    model = tiny.build_model(dataclasses.replace(preset.source, vocab_size=tiny.NUM_TOKEN_IDS - 1, derived_from=None))
    with pytest.raises(TokenizerMismatchError, match="draft model has logits for 258 ids but its tokenizer has 259"):
        SpeculativeEngine(tiny_target, dataclasses.replace(tiny_draft, model=model))


def test_engine_accepts_the_tiny_pair(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    assert spec(tiny_target.tokenizer).fingerprint() == spec(tiny_draft.tokenizer).fingerprint()
    SpeculativeEngine(tiny_target, tiny_draft)
