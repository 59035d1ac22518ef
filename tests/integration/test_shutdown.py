"""SIGTERM to the orchestrator (`python -m orchestrator`) and to the whole stack (`specserve serve`, Ray): new
requests are refused, the streams in flight finish with the right tokens, and the process exits 0. Every
process is stopped, whatever fails."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.launcher import free_port, worker_processes
from specserve.models.loading import ModelConfig
from specserve_client import SpecServeClient
from tests.served import local_serve, wait_until_serving

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


def _http_stream(port: int, body: dict[str, object], events: list[dict[str, object]], errors: list[str]) -> None:
    """POST a streaming completion; every server-sent event's JSON goes to `events` (errors to `errors`)."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        for line in response:
            if line.startswith(b"data: {"):
                events.append(json.loads(line[len(b"data: ") :]))
    except Exception as error:  # noqa: BLE001 - reported by the test
        errors.append(repr(error))


def test_sigterm_to_specserve_serve_drains_grpc_and_http_streams_then_exits_zero(
    engine: SpeculativeEngine, tmp_path: Path
) -> None:
    """The whole stack on a local Ray instance. SIGTERM goes to the process group, as `kill -TERM -PGID`,
    systemd (the whole cgroup) or a terminal would send it: the driver and Ray's processes all get it."""
    port, http_port, max_tokens = free_port(), free_port(), 300
    flags = ["--target", "tiny", "--draft", "tiny-draft", "--target-dtype", "float32", "--draft-dtype", "float32",
             "--target-device", "cpu", "--draft-device", "cpu", "--port", str(port), "--http-port", str(http_port),
             "--shutdown-grace-s", "120"]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with local_serve(flags, log_path) as serve:
        wait_until_serving(port, serve)
        with SpecServeClient(f"127.0.0.1:{port}", timeout_s=120) as client:
            events: list[dict[str, object]] = []
            errors: list[str] = []
            body = {"model": "tiny", "prompt": "def f(", "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            http_client = threading.Thread(target=_http_stream, args=(http_port, body, events, errors))
            http_client.start()
            stream_started = time.monotonic()
            stream = client.stream("def f(", max_tokens=max_tokens, ignore_eos=True)
            chunks = [next(stream)]
            deadline = time.monotonic() + 60
            while not events and not errors and time.monotonic() < deadline:
                time.sleep(0.05)
            assert events, f"the HTTP stream did not start: {errors}"
            started = time.monotonic()
            os.killpg(serve.pid, signal.SIGTERM)
            time.sleep(0.5)  # the signal is handled: the server stops taking calls
            with SpecServeClient(f"127.0.0.1:{port}", timeout_s=10) as late, pytest.raises(grpc.RpcError) as refused:
                late.generate("x = ", max_tokens=4)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            chunks += list(stream)
            http_client.join(120)
        finished_after_s = time.monotonic() - started
        token_ids = [t for c in chunks for t in c.token_ids]
        expected = engine.generate(
            GenerationRequest(prompt="def f(", max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True)
        ).token_ids
        assert token_ids == expected and chunks[-1].finish_reason == "length"
        assert not errors, errors
        last = events[-1]
        assert last["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
        assert last["speculation"]["generated_tokens"] == max_tokens  # type: ignore[index]
        http_text = "".join(e["choices"][0]["text"] for e in events)  # type: ignore[index]
        assert http_text == "".join(c.text for c in chunks)  # the same greedy tokens through both APIs
        signalled_after_s = started - stream_started
        assert chunks[-1].stats.total_ms / 1000 > signalled_after_s + 0.5  # still decoding at the signal: drained
        assert serve.wait(timeout=90) == 0
        output = log_path.read_text(errors="replace")
        assert "SIGTERM received" not in output and "PC: @" not in output, output[-3000:]
        assert "cancelled" not in output, output[-3000:]
        print(f"\nfigure: SIGTERM to the process group; both {max_tokens}-token streams finished correctly "
              f"{finished_after_s:.2f}s later; exit 0 after {time.monotonic() - started:.2f}s")  # fmt: skip
