"""The shipped benchmark workloads."""

from __future__ import annotations

import pytest

from specserve.bench.runner import humaneval_prompts
from specserve.bench.workloads import CATEGORIES, CHARS_PER_TOKEN, workload


def test_every_category_has_chat_prompts() -> None:
    assert set(CATEGORIES) == {"chat", "summarisation", "translation", "question answering", "maths"}
    for category in CATEGORIES:
        prompts = workload(category, 3)
        assert len(prompts) == 3 and all(chat and text.strip() for text, chat in prompts)


def test_code_and_long_prompts() -> None:
    code = workload("code", 2)
    assert len(code) == 2 and not code[0][1] and code[0][0].startswith("from typing import List")
    for (text, chat), last in zip(workload("long-1024", 3), humaneval_prompts(3)):
        assert not chat and len(text) >= 1024 * CHARS_PER_TOKEN
        assert text.endswith(last)  # other prompts as context, then a whole one to complete
    with pytest.raises(ValueError, match="unknown category 'poetry'"):
        workload("poetry", 1)
