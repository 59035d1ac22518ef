"""The shipped benchmark workloads."""

from __future__ import annotations

import ast
import configparser
import json

import pytest
import yaml

from specserve.bench.edit_prompts import EDITS, edit_prompts
from specserve.bench.workloads import CATEGORIES, CHARS_PER_TOKEN, humaneval_prompts, workload


def test_every_category_has_chat_prompts() -> None:
    assert set(CATEGORIES) == {"chat", "summarisation", "translation", "question answering", "maths", "edit"}
    for category in CATEGORIES:
        prompts = workload(category, 3)
        assert len(prompts) == 3 and all(chat and text.strip() for text, chat in prompts)


def test_code_and_long_prompts() -> None:
    code = workload("code", 2)
    assert len(code) == 2 and not code[0][1] and code[0][0].startswith("from typing import List")
    for (text, chat), last in zip(workload("long-1024", 3), humaneval_prompts(3)):
        assert not chat and len(text) >= 1024 * CHARS_PER_TOKEN
        assert text.endswith(last)  # other prompts as context, then a whole one to complete
    with pytest.raises(ValueError, match="unknown category 'poetry'.*maths, edit"):
        workload("poetry", 1)


def test_edit_prompts_embed_the_code_they_ask_to_edit() -> None:
    prompts = edit_prompts()
    assert len(prompts) >= 30 and len(set(prompts)) == len(prompts)
    assert len({snippet for _, _, snippet in EDITS}) == len(EDITS)  # no snippet reused under another instruction
    for prompt, (instruction, language, snippet) in zip(prompts, EDITS, strict=True):
        assert 10 <= snippet.count("\n") <= 40, instruction
        assert prompt.startswith(instruction) and "one code block" in prompt
        assert prompt.endswith(f"```{language}\n{snippet}```")  # the whole snippet, verbatim, at the end
    assert sum(language == "python" for _, language, _ in EDITS) >= 0.75 * len(EDITS)  # mostly Python


def test_edit_snippets_are_well_formed() -> None:
    """Realistic code: every snippet parses in its language (the bugs to fix are logic bugs, not syntax)."""
    parse = {"python": ast.parse, "json": json.loads, "yaml": yaml.safe_load, "text": str.strip,
             "ini": lambda s: configparser.ConfigParser().read_string(s)}  # fmt: skip
    for _, language, snippet in EDITS:
        parse[language](snippet)


def test_edit_workload_is_chat_templated_and_capped() -> None:
    prompts = workload("edit", 5)
    assert [text for text, _ in prompts] == edit_prompts()[:5] and all(chat for _, chat in prompts)
    assert len(workload("edit", 1000)) == len(EDITS)
