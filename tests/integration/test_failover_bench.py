"""`python -m specserve.bench.failover` on the tiny pair: two target replicas, one killed mid-stream, every
output compared with batch-1 target-only (fp32 on CPU: identical), and a departure it must call real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inprocess.engine import SpeculativeEngine
from specserve.bench.failover import FailoverConfig, FailoverResult, StreamResult, _check_departures, format_table
from specserve.bench.lossless import reference_logits
from specserve.config import GenerationRequest
from specserve.models.config import ModelConfig

TINY = ModelConfig("tiny", device="cpu", dtype="float32")
TINY_DRAFT = ModelConfig("tiny-draft", device="cpu", dtype="float32")


def test_a_target_killed_mid_stream_leaves_every_output_equal_to_target_only(tmp_path: Path) -> None:
    max_tokens, out = 120, tmp_path / "failover.json"
    command = [sys.executable, "-m", "specserve.bench.failover", "--target", "tiny", "--draft", "tiny-draft",
               "--target-dtype", "float32", "--draft-dtype", "float32", "--target-device", "cpu",
               "--draft-device", "cpu", "--num-streams", "3", "--max-tokens", str(max_tokens),
               "--kill-after-tokens", "40", "--json", str(out)]  # fmt: skip
    # the bench stops the workers it starts, also when it fails
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-5000:]
    result = json.loads(out.read_text())
    assert result["killed_sessions"] >= 1 and result["num_real_departures"] == 0
    for stream in result["streams"]:
        assert len(stream["token_ids"]) == max_tokens and stream["finish_reason"] == "length", stream
        assert 40 <= stream["tokens_at_kill"] < max_tokens and not stream["error"]  # killed mid-stream
    assert "moved to target replica" in run.stderr  # sessions failed over
    assert "3/3 identical" in run.stdout, run.stdout
    print("\n" + run.stdout)


def test_a_departure_that_is_no_near_tie_is_reported_as_real(engine: SpeculativeEngine) -> None:
    prompt = "def f("
    request = GenerationRequest(prompt=prompt, max_tokens=8, num_speculative_tokens=0, ignore_eos=True)
    greedy = engine.generate(request).token_ids
    logits = reference_logits(engine.target, engine.tokenize(request), greedy[:3])
    departed = greedy[:3] + [int(logits.argmin())] + greedy[4:]
    config = FailoverConfig(TINY, TINY_DRAFT, num_streams=2, max_tokens=8, kill_after_tokens=4)
    result = FailoverResult("127.0.0.1:1", 1, [StreamResult(prompt, list(greedy)), StreamResult(prompt, departed)])
    _check_departures(config, result)
    assert result.streams[0].departure is None
    assert result.streams[1].departure is not None and result.streams[1].departure["position"] == 3
    assert result.num_real_departures == 1
    table = format_table(config, result)
    assert "REAL DEPARTURE" in table and "1/2 identical, 0 departed at near-ties, 1 errors or real departures" in table
