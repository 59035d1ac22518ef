"""SIGTERM to the orchestrator process (`python -m orchestrator`): new requests are refused, the stream in
flight finishes with the right tokens, and the process exits 0. Every process is stopped, whatever fails."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import pytest

from orchestrator.client import SpecServeClient
from specserve.config import GenerationRequest
from specserve.engine import SpeculativeEngine
from specserve.launcher import free_port, worker_processes
from specserve.models.loading import ModelConfig

TINY = ModelConfig("tiny", device="cpu", dtype="float32")
TINY_DRAFT = ModelConfig("tiny-draft", device="cpu", dtype="float32")


def _wait_until_serving(client: SpecServeClient, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, "the orchestrator exited during start-up"
        try:
            client.info()
            return
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the orchestrator did not serve in time"
            time.sleep(0.2)


def test_sigterm_drains_the_stream_in_flight_then_exits_zero(
    engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # three processes share the test machine's cores
    with worker_processes(TINY, TINY_DRAFT) as workers:
        port = free_port()
        command = [sys.executable, "-m", "orchestrator", "--target", workers["target"], "--draft", workers["draft"],
                   "--port", str(port), "--shutdown-grace-s", "60", "--no-http"]  # fmt: skip
        orchestrator = subprocess.Popen(command)
        try:
            with SpecServeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
                _wait_until_serving(client, orchestrator)
                started = time.monotonic()
                stream = client.stream("def f(", max_tokens=450, ignore_eos=True, num_speculative_tokens=4)
                token_ids = list(next(stream).token_ids)
                orchestrator.send_signal(signal.SIGTERM)
                signalled_after_s = time.monotonic() - started
                time.sleep(0.5)  # the signal is handled: the server stops taking calls
                with (
                    SpecServeClient(f"127.0.0.1:{port}", timeout_s=10) as late,
                    pytest.raises(grpc.RpcError) as refused,
                ):
                    late.generate("x = ", max_tokens=4)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
                chunks = list(stream)
            token_ids += [t for c in chunks for t in c.token_ids]
            expected = engine.generate(
                GenerationRequest(prompt="def f(", max_tokens=450, num_speculative_tokens=0, ignore_eos=True)
            ).token_ids
            assert token_ids == expected and chunks[-1].finish_reason == "length"
            assert chunks[-1].stats.total_ms / 1000 > signalled_after_s + 0.5  # it was still decoding: drained
            assert orchestrator.wait(timeout=30) == 0
            print(f"\nfigure: SIGTERM {signalled_after_s:.2f}s into a {len(token_ids)}-token stream: it finished after "
                  f"{chunks[-1].stats.total_ms / 1000:.2f}s, correct; exit 0")  # fmt: skip
        finally:
            if orchestrator.poll() is None:
                orchestrator.kill()
                orchestrator.wait(10)
