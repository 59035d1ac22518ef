"""Draft/target tokenizer compatibility: speculation across different vocabularies is silently wrong."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the transport maps TokenizerMismatchError without loading transformers
    from transformers import PreTrainedTokenizerBase


class TokenizerMismatchError(ValueError):
    """Draft and target tokenizers differ, or a model has no logits for some of its tokenizer's ids."""


def tokenizer_vocab_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """How many ids stand for tokens: one past the highest id that is not a padding placeholder.

    Models pad their embedding beyond the tokenizer (Qwen2.5: 151,665 token ids; 151,936 rows at 0.5B,
    152,064 at 7B). llama.cpp's GGUF conversion names each padding id `[PAD<id>]` in the vocabulary, so
    a tokenizer read from a GGUF lists them; they are padding all the same."""
    return 1 + max(idx for token, idx in tokenizer.get_vocab().items() if token != f"[PAD{idx}]")


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """What must match for token ids to mean the same text on both sides, and the model's logits width,
    which may differ: rows past the tokenizer's ids are padding, masked out of both sides' distributions."""

    vocab: dict[str, int]  # every token below vocab_size -> id
    merges: list[str]
    special_tokens: dict[str, int]  # every added/special token -> id
    vocab_size: int  # the tokenizer's ids: 0..vocab_size - 1
    padded_vocab_size: int  # the model's logits width: vocab_size plus padding rows no token uses

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, padded_vocab_size: int) -> TokenizerSpec:
        added = tokenizer.added_tokens_decoder.items()
        special = {tok.content: idx for idx, tok in added if tok.content != f"[PAD{idx}]"}  # padding is not a token
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = getattr(tokenizer, name, None)
            if value is not None:
                special.setdefault(f"{name}:{value}", tokenizer.convert_tokens_to_ids(value))
        vocab_size = tokenizer_vocab_size(tokenizer)
        vocab = {token: idx for token, idx in tokenizer.get_vocab().items() if idx < vocab_size}
        return cls(vocab, _merges(tokenizer), special, vocab_size, padded_vocab_size)

    def fingerprint(self) -> str:
        """sha256 over everything that must match (not the padded width), so remote services compare one string."""
        blob = json.dumps(
            [sorted(self.vocab.items()), self.merges, sorted(self.special_tokens.items()), self.vocab_size]
        )
        return hashlib.sha256(blob.encode()).hexdigest()


def _merges(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    model: dict[str, Any] = json.loads(backend.to_str()).get("model", {})
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def check_compatible(draft: TokenizerSpec, target: TokenizerSpec) -> None:
    """Raise TokenizerMismatchError naming every difference; return quietly when they match. The logits
    widths may differ (padding), as long as each model scores every id of its tokenizer."""
    problems = [
        problem
        for role, spec in (("draft", draft), ("target", target))
        if (problem := unscored_ids(role, spec.vocab_size, spec.padded_vocab_size)) is not None
    ]
    if draft.vocab != target.vocab:
        problems.append("vocabularies differ: " + _dict_diff(draft.vocab, target.vocab))
    if draft.merges != target.merges:
        first = next((i for i, (a, b) in enumerate(zip(draft.merges, target.merges)) if a != b), None)
        where = f"first difference at merge {first}" if first is not None else "one is a prefix of the other"
        problems.append(f"merges differ ({len(draft.merges)} vs {len(target.merges)}; {where})")
    if draft.special_tokens != target.special_tokens:
        problems.append("special tokens differ: " + _dict_diff(draft.special_tokens, target.special_tokens))
    if problems:
        raise TokenizerMismatchError(
            "draft and target tokenizers are not compatible, so draft token ids would not mean the target's "
            "tokens: " + "; ".join(problems)
        )


def unscored_ids(role: str, vocab_size: int, padded_vocab_size: int) -> str | None:
    """What is wrong when a model has logits for fewer ids than its tokenizer has; None when it has enough."""
    if padded_vocab_size >= vocab_size:
        return None
    return (
        f"the {role} model has logits for {padded_vocab_size} ids but its tokenizer has {vocab_size}: "
        f"ids {padded_vocab_size}..{vocab_size - 1} could never be scored"
    )


def _dict_diff(draft: dict[str, int], target: dict[str, int], show: int = 3) -> str:
    only_draft = sorted(set(draft) - set(target))
    only_target = sorted(set(target) - set(draft))
    changed = sorted(key for key in set(draft) & set(target) if draft[key] != target[key])
    parts = []
    if only_draft:
        parts.append(f"{len(only_draft)} only in draft (e.g. {only_draft[:show]})")
    if only_target:
        parts.append(f"{len(only_target)} only in target (e.g. {only_target[:show]})")
    if changed:
        parts.append(
            f"{len(changed)} with different ids (e.g. "
            + ", ".join(f"{key!r}: draft {draft[key]} vs target {target[key]}" for key in changed[:show])
            + ")"
        )
    return ", ".join(parts)
