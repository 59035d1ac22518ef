"""The load sweep against a served stack of tiny models: every request answered, and under batching
every output equal to target-only's or departing from it only at a near-tie."""

from __future__ import annotations

import time

import pytest

from inprocess.engine import SpeculativeEngine
from specserve.bench.load import Compared, Mode, check_departures, parse_mode, rate_sweep, run_load, sweep
from specserve.bench.lossless import reference_logits
from specserve.config import GenerationRequest
from specserve.models.loading import LoadedModel
from specserve_client import SpecServeClient
from tests.helpers import assert_divergence_is_near_tie
from tests.stack import LocalStack

PROMPTS = [("def add(a, b):", False), ("import os\n", False), ("class Tree:", False), ("# parse the line\n", False)]


def test_concurrent_batched_requests_match_target_only(engine: SpeculativeEngine, tiny_target: LoadedModel) -> None:
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        for mode in ("k=4", "adaptive"):
            run = run_load({False: client}, mode, concurrency=4, prompts=PROMPTS, max_tokens=48, requests_per_client=2)
            assert not run.errors and len(run.outputs) == 8
            assert run.proposed > 0
            for (_, index, j), output in run.outputs.items():
                prompt = PROMPTS[(index + j * 4) % len(PROMPTS)][0]
                request = GenerationRequest(prompt=prompt, max_tokens=48, num_speculative_tokens=0, ignore_eos=True)
                prompt_ids = engine.tokenize(request)
                assert_divergence_is_near_tie(tiny_target, prompt_ids, engine.generate(request).token_ids, output)


def test_the_sweep_reports_every_mode_at_every_concurrency() -> None:
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        workloads = {"code": PROMPTS, "chat": [("Say hello", True)]}
        rows = sweep({False: client}, workloads, [1, 2], max_tokens=16, requests_per_client=1, log=False)
    assert [(r["category"], r["concurrency"], r["mode"]) for r in rows] == [
        (w, c, m) for w in ("code", "chat") for c in (1, 2) for m in ("target-only", "k=4", "adaptive")
    ]
    assert all(r["errors"] == 0 and r["requests"] == r["concurrency"] and r["tokens_per_second"] > 0 for r in rows)
    assert rows[0]["acceptance_rate"] is None and rows[1]["acceptance_rate"] is not None
    assert all(r["identical_to_target_only"] == r["requests"] for r in rows if r["mode"] == "target-only")
    for row in rows:
        speculative = row["mode"] != "target-only"
        assert (row["efficiency"] == pytest.approx(1.0)) != speculative  # target-only is its own bound
        assert (len(row["acceptance_at_position"]) > 0) == (row["mean_k"] > 0)
        assert row["mean_acceptance_length"] >= 1.0


def test_the_near_tie_check_passes_a_batched_sweep_and_catches_a_real_disagreement(
    engine: SpeculativeEngine, tiny_target: LoadedModel
) -> None:
    compared: list[Compared] = []
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        rows = sweep({False: client}, {"code": PROMPTS}, [2], 24, 2, log=False, compared=compared)
    assert [row for row, _, _ in compared] == rows
    assert check_departures(tiny_target, compared, log=False) == 0
    for row in rows:  # target-only's batched passes too, against batch-1 decoding
        assert row["departures"] == row["near_tie_departures"] <= row["requests"]
    # no near-tie: one of k=4's outputs takes the target's least likely token at position 5
    row, run, _ = compared[1]
    key = next(iter(run.outputs))
    text, output = run.prompts[key][0], run.outputs[key]
    request = GenerationRequest(prompt=text, max_tokens=len(output), num_speculative_tokens=0, ignore_eos=True)
    greedy = engine.generate(request).token_ids
    logits = reference_logits(tiny_target, engine.tokenize(request), greedy[:5])
    run.outputs[key] = greedy[:5] + [int(logits.argmin())] + output[6:]
    assert check_departures(tiny_target, compared, log=False) == 1
    assert row["near_tie_departures"] == row["departures"] - 1
    assert [d for d in row["divergences"] if not d["near_tie"]][0]["position"] == 5


def test_a_k_sweep_with_the_early_stop_modes_runs_target_only_first() -> None:
    overrides = {"draft_confidence_threshold": 0.05}
    with LocalStack() as plain, LocalStack(orchestrator=overrides) as stopping:
        with SpecServeClient(plain.address) as client, SpecServeClient(stopping.address) as stop_client:
            modes = ("k=2", "k=6", "k=6+stop")
            rows = sweep({False: client, True: stop_client}, {"code": PROMPTS}, [1], 24, 2, log=False, modes=modes)
    assert [r["mode"] for r in rows] == ["target-only", "k=2", "k=6", "k=6+stop"]
    assert all(r["errors"] == 0 and r["identical_to_target_only"] == 2 for r in rows)
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["k=2"]["mean_k"] <= 2 and len(by_mode["k=6"]["acceptance_at_position"]) == 6
    assert by_mode["k=6+stop"]["mean_k"] < by_mode["k=6"]["mean_k"]


def test_a_control_runs_its_mode_again_in_turns_of_its_own() -> None:
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        modes = ("target-only#2", "k=2")
        rows = sweep({False: client}, {"code": PROMPTS}, [2], 16, 1, log=False, modes=modes, repeats=2)
    assert [r["mode"] for r in rows] == ["target-only", "target-only#2", "k=2"]
    control = rows[1]
    assert control["mean_k"] == 0 and control["acceptance_rate"] is None  # measured as target-only is
    assert control["identical_to_target_only"] == control["requests"] == 4
    for row in rows:  # each turn's figure kept; the row's is over all of them
        turns = row["tokens_per_second_by_turn"]
        assert len(turns) == 2 and min(turns) <= row["tokens_per_second"] <= max(turns)


def test_a_timed_run_counts_the_window_and_cuts_the_requests_still_running(tiny_target: LoadedModel) -> None:
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        short = run_load({False: client}, "k=4", 2, PROMPTS, 32, 0, duration_s=2.0, warmup_s=0.5)
        started = time.perf_counter()
        # one 480-token request takes the tiny pair over a second at k = 4: it is still running at 0.7 s
        long = run_load({False: client}, "k=4", 1, PROMPTS, 480, 0, duration_s=0.5, warmup_s=0.2)
        elapsed = time.perf_counter() - started
        assert client.generate("def f():", max_tokens=4, ignore_eos=True).text  # still serving after the cuts
    assert short.errors == long.errors == [] and short.seconds == 2.0 and long.seconds == 0.5
    # the first request of each client is shortened (1/2, 2/2 of the length) to spread their phases
    assert {len(tokens) for tokens in short.outputs.values()} == {16, 32}
    full = sum(len(tokens) == 32 for tokens in short.outputs.values())
    assert len(short.latencies) == len(short.tpots) == full  # latency figures: full-length requests only
    assert short.counted_tokens != sum(len(tokens) for tokens in short.outputs.values())  # the warm-up's not counted
    assert not long.outputs and long.counted_tokens > 0  # none finished; the window's tokens count
    assert elapsed < 0.7 + 0.5  # the call still streaming at the end was cancelled, not awaited


def test_mode_names() -> None:
    assert parse_mode("target-only") == Mode("target-only", 0)
    assert parse_mode("k=6") == Mode("k=6", 6)
    assert parse_mode("adaptive+stop") == Mode("adaptive+stop", None, early_stop=True)
    assert parse_mode("target-only#2") == Mode("target-only#2", 0)
    assert parse_mode("adaptive+stop#b") == Mode("adaptive+stop#b", None, early_stop=True)
    assert parse_mode("k=4@tiny-draft+ngram#2") == Mode("k=4@tiny-draft+ngram#2", 4, draft="tiny-draft+ngram")
    assert parse_mode("adaptive@ngram").client_key == "ngram" and parse_mode("k=2+stop").client_key is True
    for bad in ("k=0", "k=x", "fast", "target-only+stop", "target-only#", "k=4#a b", "fast#2", "adaptive@",
                "target-only@ngram", "k=4+stop@ngram"):  # fmt: skip
        with pytest.raises(ValueError, match="unknown mode"):
            parse_mode(bad)


def test_modes_over_an_extra_draft_go_to_its_orchestrator() -> None:
    with LocalStack() as stack, LocalStack(draft="ngram") as lookup:
        with SpecServeClient(stack.address) as client, SpecServeClient(lookup.address) as lookup_client:
            clients = {False: client, "ngram": lookup_client}
            rows = sweep(clients, {"code": PROMPTS[:1]}, [1], 24, 1, modes=("target-only", "k=4", "k=4@ngram"),
                         log=False)  # fmt: skip
    by_mode = {row["mode"]: row for row in rows}
    assert set(by_mode) == {"target-only", "k=4", "k=4@ngram"} and all(row["errors"] == 0 for row in rows)
    assert by_mode["k=4@ngram"]["identical_to_target_only"] == 1
    assert by_mode["k=4@ngram"]["mean_k"] != by_mode["k=4"]["mean_k"]  # lookup's windows: shorter or none


def test_open_loop_arrivals_at_a_request_rate() -> None:
    with LocalStack() as stack, SpecServeClient(stack.address) as client:
        rows = rate_sweep({False: client}, PROMPTS, [20.0], max_tokens=16, num_requests=6, log=False)
    assert [r["mode"] for r in rows] == ["target-only", "k=4", "adaptive"]
    assert all(r["request_rate"] == 20.0 and r["requests"] == 6 and r["errors"] == 0 for r in rows)
    assert rows[0]["identical_to_target_only"] == 6
