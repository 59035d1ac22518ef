"""`specserve bench` in process on the tiny pair: every mode measured, the early-stop modes with shorter
windows, and every output equal to target-only's (float32 at batch 1); a load benchmark stopped by
SIGTERM takes its worker processes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specserve.bench.report import machine
from specserve.bench.runner import BenchConfig, run_bench
from specserve.models.packing import packing_supported
from tests.stack import LocalStack


def test_the_in_process_bench_with_the_early_stop_modes() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=2, max_tokens=24, ks=(2, 6), baseline_dtypes=("float32",),
        draft_quantization="none", hf=False, hf_fp32_draft=False, stop_threshold=0.9,
    )  # fmt: skip
    rows = {row["mode"]: row for row in run_bench(cfg)["modes"]}
    speculative = ["specserve k=2", "specserve k=6", "specserve k=2+stop", "specserve k=6+stop"]
    assert list(rows) == ["target-only float32", *speculative]
    for name in speculative:
        assert rows[name]["identical_to_target_only"] == "2/2", name
        assert rows[name]["tokens_per_second"] > 0 and rows[name]["theoretical_speedup"] > 0
    assert rows["specserve k=6"]["mean_window"] > rows["specserve k=2"]["mean_window"]  # shorter near the end only
    assert 0 < rows["specserve k=6+stop"]["mean_window"] < rows["specserve k=6"]["mean_window"]
    assert "below confidence 0.9" in rows["specserve k=6+stop"]["settings"]


def test_a_benchmark_records_the_machine_it_ran_on() -> None:
    described = machine()
    assert described["cpu"] and described["cores"] == os.cpu_count() and described["torch"] == torch.__version__
    assert described["gpu"] is None or isinstance(described["gpu"], str)


def test_a_terminated_load_benchmark_stops_its_workers() -> None:
    command = [sys.executable, "-m", "specserve.cli", "bench", "load", "--model", "tiny", "--draft", "tiny-draft",
               "--concurrency", "1", "--duration", "600", "--max-tokens", "8"]  # fmt: skip
    bench = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = Path(f"/proc/{bench.pid}/task/{bench.pid}/children")
    deadline = time.monotonic() + 120
    while len(workers := children.read_text().split()) < 2:  # the target and draft services
        assert bench.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.2)
    time.sleep(3)  # into the run
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=60) != 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid


def test_speedups_are_against_the_fastest_target_only_setting_the_peer_s_included() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=2, max_tokens=16, ks=(2,), baseline_dtypes=("float32",),
        draft_quantization="none", hf=True, hf_fp32_draft=False, hf_plain_target=False,
    )  # fmt: skip
    summary = run_bench(cfg)
    target_only = [row for row in summary["modes"] if row["kind"] == "target-only"]
    assert {row["mode"] for row in target_only} == {"target-only float32", "hf target-only"}
    fastest = max(target_only, key=lambda row: row["tokens_per_second"])
    assert summary["baseline"] == fastest["mode"] and fastest["speedup_vs_target"] == 1.0
    assert all(row["speedup_vs_target"] <= 1.0 for row in target_only)


@pytest.mark.skipif(not packing_supported(), reason="this CPU has no oneDNN bfloat16 support")
def test_a_packed_target_runs_the_peer_again_on_plain_weights() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=1, max_tokens=12, ks=(2,), target_dtype="bfloat16",
        baseline_dtypes=("bfloat16",), draft_quantization="none", hf=True, hf_ks=(2,), hf_fp32_draft=False,
    )  # fmt: skip
    rows = {row["mode"]: row for row in run_bench(cfg)["modes"]}
    peer = ["hf target-only", "hf assisted k=2", "hf assisted default"]
    assert list(rows) == ["target-only bfloat16", "specserve k=2", *peer, *(f"{name} plain" for name in peer)]
    assert all("plain weights, SDPA" in rows[f"{name} plain"]["settings"] for name in peer)
    # packing changes no logit; SDPA in place of few-query attention rounds differently: near-ties only
    assert all(departure["near_tie"] for departure in rows["hf target-only plain"]["divergences"])


def test_the_served_bench_measures_the_server_s_default_adaptive_k() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=1, max_tokens=24, ks=(2,), baseline_dtypes=("float32",),
        draft_quantization="none", hf=False, hf_fp32_draft=False, served=True,
    )  # fmt: skip
    rows = {row["mode"]: row for row in run_bench(cfg)["modes"]}
    adaptive = rows["served adaptive"]
    assert "adaptive k <= 8" in adaptive["settings"] and adaptive["identical_to_target_only"] == "1/1"
    # the policy may hold target-only on the tiny models, where overhead outweighs drafting: then no window
    assert adaptive.get("mean_window", 0) <= 8 and adaptive.get("theoretical_speedup", 1) > 0
    assert rows["served k=2"]["mean_window"] <= 2


def test_the_served_bench_measures_lookup_and_hybrid_drafts_over_the_same_target() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=1, max_tokens=32, ks=(4,), baseline_dtypes=("float32",),
        draft_quantization="none", hf=False, hf_fp32_draft=False, served=True, in_process=False,
        categories=("code", "translation"), extra_drafts=("ngram", "tiny-draft+ngram"),
    )  # fmt: skip
    summary = run_bench(cfg)
    rows = {row["mode"]: row for row in summary["modes"]}
    extra = [f"served {draft} {mode}" for draft in ("ngram", "tiny-draft+ngram") for mode in ("adaptive", "k=4")]
    assert list(rows)[-4:] == extra
    for name in extra:  # one code and one chat-templated prompt, each checked against the served target-only
        assert rows[name]["tokens"] == 2 * 32 and "divergences" in rows[name], name
        assert all(departure["near_tie"] for departure in rows[name]["divergences"]), name
        assert "served_vs_in_process" not in rows[name]
    assert "draft ngram" in rows["served ngram k=4"]["settings"]
    assert rows["served tiny-draft+ngram k=4"]["acceptance_rate"] > 0  # the tiny target repeats itself
    assert set(rows["served ngram k=4"]["proposed_by_source"]) <= {"ngram"}
    hybrid = rows["served tiny-draft+ngram k=4"]["proposed_by_source"]
    assert sum(hybrid.values()) > 0 and set(hybrid) <= {"model", "ngram"}
    with pytest.raises(ValueError, match="add served"):
        BenchConfig(target="tiny", draft="tiny-draft", extra_drafts=("ngram",))


def test_without_in_process_modes_the_served_stack_meets_the_peer_as_transformers_ships_it() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=1, max_tokens=16, ks=(2,), baseline_dtypes=("float32",),
        draft_quantization="none", hf=True, hf_ks=(2,), hf_fp32_draft=False, served=True, in_process=False,
    )  # fmt: skip
    summary = run_bench(cfg)
    rows = {row["mode"]: row for row in summary["modes"]}
    peer = ["hf target-only plain", "hf assisted k=2 plain", "hf assisted default plain"]
    assert list(rows)[:3] == peer and not any(name.startswith(("target-only", "specserve")) for name in rows)
    assert all("plain weights, SDPA" in rows[name]["settings"] for name in peer)
    assert rows["served adaptive"]["theoretical_speedup"] > 0  # priced against the served target-only's step
    for name in [*peer, "served adaptive", "served k=2"]:  # every output checked against the served target-only
        assert all(departure["near_tie"] for departure in rows[name]["divergences"]), name
    fastest = max(["served target-only", "hf target-only plain"], key=lambda name: rows[name]["tokens_per_second"])
    assert summary["baseline"] == fastest and rows[fastest]["speedup_vs_target"] == 1.0


def test_without_in_process_modes_target_only_runs_in_process_in_the_dtypes_the_served_target_does_not() -> None:
    cfg = BenchConfig(
        target="tiny", draft="tiny-draft", num_prompts=1, max_tokens=12, ks=(), baseline_dtypes=("float32", "bfloat16"),
        draft_quantization="none", hf=False, hf_fp32_draft=False, served=True, in_process=False,
    )  # fmt: skip
    summary = run_bench(cfg)  # the tiny target is served in float32
    rows = {row["mode"]: row for row in summary["modes"]}
    assert [name for name in rows if name.startswith("target-only")] == ["target-only bfloat16"]
    bfloat16 = rows["target-only bfloat16"]
    assert bfloat16["settings"] == "target bfloat16" and bfloat16["tokens"] == 12
    fastest = max(["served target-only", "target-only bfloat16"], key=lambda name: rows[name]["tokens_per_second"])
    assert summary["baseline"] == fastest


def test_without_in_process_modes_the_bench_needs_a_served_stack() -> None:
    with pytest.raises(ValueError, match="served stack or an address"):
        BenchConfig(target="tiny", draft="tiny-draft", in_process=False)


def test_without_in_process_modes_a_running_orchestrator_is_the_reference() -> None:
    with LocalStack() as stack:
        cfg = BenchConfig(
            target="tiny", draft="tiny-draft", num_prompts=1, max_tokens=12, ks=(2,), baseline_dtypes=("float32",),
            draft_quantization="none", hf=False, hf_fp32_draft=False, address=stack.address, in_process=False,
        )  # fmt: skip
        summary = run_bench(cfg)
    rows = {row["mode"]: row for row in summary["modes"]}
    assert list(rows) == ["remote target-only", "remote k=2"]
    assert summary["baseline"] == "remote target-only" and rows["remote k=2"]["theoretical_speedup"] > 0
