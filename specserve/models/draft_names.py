"""Draft model names that are not models: `ngram` (prompt lookup) and `MODEL+ngram` (the hybrid). Imports
nothing heavy: the CLI and the deploy config read them before any model library loads."""

from __future__ import annotations

NGRAM = "ngram"
"""The draft model name of prompt lookup; `MODEL+ngram` names the hybrid of MODEL and lookup."""


def parse_draft_name(name: str) -> tuple[str | None, bool]:
    """(the draft model to load or None, whether lookup drafts too): `ngram` -> (None, True),
    `tiny-draft+ngram` -> ("tiny-draft", True), `tiny-draft` -> ("tiny-draft", False)."""
    if name.lower() == NGRAM:
        return None, True
    model, plus, suffix = name.rpartition("+")
    if plus and suffix.lower() == NGRAM:
        if not model:
            raise ValueError(f"draft model name {name!r}: give MODEL+{NGRAM} or {NGRAM}")
        return model, True
    return name, False
