"""Draft/target tokenizer compatibility: speculation across different vocabularies is silently wrong."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the transport maps TokenizerMismatchError without loading transformers
    from transformers import PreTrainedTokenizerBase


class TokenizerMismatchError(ValueError):
    """Draft and target tokenizers (or vocabulary sizes) differ."""


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """What must match for token ids to mean the same text on both sides."""

    vocab: dict[str, int]
    merges: list[str]
    special_tokens: dict[str, int]  # every added/special token -> id
    model_vocab_size: int

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, model_vocab_size: int) -> TokenizerSpec:
        special = {tok.content: idx for idx, tok in tokenizer.added_tokens_decoder.items()}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = getattr(tokenizer, name, None)
            if value is not None:
                special.setdefault(f"{name}:{value}", tokenizer.convert_tokens_to_ids(value))
        return cls(dict(tokenizer.get_vocab()), _merges(tokenizer), special, model_vocab_size)

    def fingerprint(self) -> str:
        """sha256 over everything compared, so remote services can compare in one string."""
        blob = json.dumps(
            [sorted(self.vocab.items()), self.merges, sorted(self.special_tokens.items()), self.model_vocab_size]
        )
        return hashlib.sha256(blob.encode()).hexdigest()


def _merges(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    model: dict[str, Any] = json.loads(backend.to_str()).get("model", {})
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def check_compatible(draft: TokenizerSpec, target: TokenizerSpec) -> None:
    """Raise TokenizerMismatchError naming every difference; return quietly when they match."""
    problems: list[str] = []
    if draft.model_vocab_size != target.model_vocab_size:
        problems.append(f"model vocab sizes differ: draft {draft.model_vocab_size}, target {target.model_vocab_size}")
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
