"""llama-server's command line for the load bench: a slot per client, each with room for the longest prompt
and its output (llama-server divides -c among its slots)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.bench.config import SweepConfig
from specserve.bench.llama_cpp_peer import peer_modes, server_command, slot_context


def test_a_slot_per_client_each_with_the_longest_prompt_and_its_output() -> None:
    assert slot_context(192, 0) == 256  # 192 + the 64-token margin fills one 256-token step
    assert slot_context(193, 0) == 512
    assert slot_context(300, 128) == 512
    speculative = peer_modes(Path("draft.gguf"), [3], lookup=False)[1]
    command = server_command(Path("bin/llama-server"), Path("target.gguf"), speculative, threads=2, port=8080,
                             slots=8, slot_context=slot_context(300, 128))  # fmt: skip

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert value("-np") == "8" and value("-c") == str(8 * 512) and value("-t") == "2" and value("-m") == "target.gguf"
    assert command[-len(speculative.args) :] == list(speculative.args)
    assert value("--spec-draft-n-max") == "3" and value("-md") == "draft.gguf"


def test_one_client_keeps_the_latency_bench_s_context() -> None:
    command = server_command(Path("llama-server"), Path("target.gguf"), peer_modes(None, [], False)[0], 4, 1)
    assert command[command.index("-np") + 1] == "1" and command[command.index("-c") + 1] == "4096"


def test_the_peer_under_load_is_greedy_only() -> None:
    with pytest.raises(ValueError, match="greedy"):
        SweepConfig(concurrency=(8,), temperature=0.7, peer_llama_cpp="bin")
