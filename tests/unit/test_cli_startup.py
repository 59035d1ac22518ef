"""The CLI starts fast and fails fast: client commands import no model library, and a busy port or a
mistyped model name is one line and a non-zero exit before anything loads (each in a fresh interpreter)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "ray")

CLIENT_COMMANDS = """
import contextlib, io, json, sys
from specserve import cli

codes = []
cli.build_parser()
for argv in (["--help"], ["generate", "--help"], ["serve", "--help"], ["generate", "--address", "127.0.0.1:1", "hi"],
             ["scale", "--address", "127.0.0.1:1", "--timeout", "2"], ["models", "list"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            codes.append(cli.main(argv))
        except SystemExit as exit:
            codes.append(exit.code)
print(json.dumps({"codes": codes, "heavy": sorted(m for m in json.loads(sys.argv[1]) if m in sys.modules)}))
"""


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_client_commands_import_no_model_library() -> None:
    completed = _run([sys.executable, "-c", CLIENT_COMMANDS, json.dumps(HEAVY)])
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0, 0, 0, 1, 1, 0]  # the two calls to a stopped server fail, as they should
    assert result["heavy"] == [], f"a client command imported {result['heavy']}"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _specserve(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    completed = _run([sys.executable, "-m", "specserve.cli", *args], timeout=30)
    return completed, time.monotonic() - started


def test_serve_on_a_busy_port_fails_at_once_in_one_line(busy_port: int) -> None:
    completed, elapsed = _specserve("serve", "--target", "tiny", "--draft", "tiny-draft", "--port", str(busy_port))
    assert completed.returncode != 0
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith(f"specserve: error: port {busy_port} on 127.0.0.1 is in use"), lines[0]
    assert elapsed < 5, f"took {elapsed:.1f}s"


def test_serve_on_a_busy_http_port_fails_at_once(busy_port: int) -> None:
    completed, elapsed = _specserve("serve", "--target", "tiny", "--draft", "none", "--port", "0",
                                    "--http-port", str(busy_port))  # fmt: skip
    assert completed.returncode != 0
    assert completed.stderr.strip().startswith(f"specserve: error: port {busy_port} on 127.0.0.1 is in use")
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert elapsed < 5, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_a_mistyped_preset_fails_at_once_with_a_suggestion(command: str) -> None:
    args = ["--port", "0", "--no-http"] if command == "serve" else ["hi"]
    completed, elapsed = _specserve(command, "--target", "qwen2.5-coder-1.5", "--draft", "tiny-draft", *args)
    assert completed.returncode == 2
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert "qwen2.5-coder-1.5" in lines[0] and "did you mean qwen2.5-coder-1.5b?" in lines[0], lines[0]
    assert elapsed < 5, f"took {elapsed:.1f}s"
