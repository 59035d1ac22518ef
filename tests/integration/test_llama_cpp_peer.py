"""llama.cpp as a peer in the load bench: a llama-server per mode with a slot per client, streamed through the
closed loop. A stand-in server (this file's script, speaking llama-server's /completion stream) covers the
path anywhere; the real llama-server (scripts/build_llama_cpp.sh's default folder) on the smaller real GGUF."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from specserve.bench.config import SweepConfig
from specserve.bench.llama_cpp_peer import load_peers, slot_context
from specserve.bench.load import prompt_token_ids, run_load
from specserve.models.loading import load_tokenizer

PROMPTS = [("def add(a, b):", False), ("import os\n", False), ("Say hello", True)]
LLAMA_CPP_BIN = Path("/tmp/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
STAND_IN = """#!{python}
# a stand-in llama-server: /health, and /completion streamed as llama-server streams it (one token an event,
# then a final event with its counts); the tokens depend on the prompt's ids; argv is kept for the test
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
argv = sys.argv[1:]
port, drafting = int(argv[argv.index("--port") + 1]), "-md" in argv
open("{argv_log}", "a").write(json.dumps(argv) + "\\n")
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{{"status": "ok"}}')
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] and body["ignore_eos"] and body["top_k"] == 1, body
        self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
        prompt, n = body["prompt"], body["n_predict"]
        for i in range(n):
            event = {{"tokens": [(sum(prompt) + i) % 100], "stop": False}}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\\n\\n"); self.wfile.flush()
            time.sleep(0.002)
        timings = {{"draft_n": n, "draft_n_accepted": n // 2}} if drafting else {{}}
        final = {{"tokens": [], "stop": True, "tokens_evaluated": len(prompt), "timings": timings}}
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\\n\\n")
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("specserve-home")


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A bin folder whose llama-server is the stand-in; its command lines go to argv.jsonl beside it."""
    binary = tmp_path / "llama-server"
    binary.write_text(STAND_IN.format(python=sys.executable, argv_log=tmp_path / "argv.jsonl"))
    binary.chmod(0o755)
    return tmp_path


def test_a_peer_mode_runs_the_closed_loop_with_a_slot_per_client(stand_in: Path, home: Path) -> None:
    sweep = SweepConfig(concurrency=(2,), max_tokens=12, peer_llama_cpp=str(stand_in), llama_cpp_draft_max=(3,))
    peers = load_peers(sweep, "tiny", "tiny-draft", home)
    with peers(PROMPTS, 2) as sends:
        assert list(sends) == ["llama.cpp target-only", "llama.cpp draft-max=3"]
        runs = {mode: run_load({}, mode, 2, PROMPTS, 12, 2, send=send) for mode, send in sends.items()}
    tokenizer = load_tokenizer("tiny", home)
    prompt_ids = [prompt_token_ids(tokenizer, prompt) for prompt in PROMPTS]  # as the orchestrator has them
    for run in runs.values():
        assert not run.errors and len(run.outputs) == 4 and len(run.latencies) == 4
        for key, output in run.outputs.items():  # what the stand-in answers to these ids
            assert output == [(sum(prompt_ids[PROMPTS.index(run.prompts[key])]) + i) % 100 for i in range(12)]
    target_only, speculative = runs["llama.cpp target-only"], runs["llama.cpp draft-max=3"]
    row = speculative.summary(target_only)
    assert row["acceptance_rate"] == 0.5 and row["identical_to_target_only"] == 4
    assert row["bound_tokens_per_second"] is None and row["efficiency"] is None  # no rounds reported
    sent = [len(prompt_ids[PROMPTS.index(prompt)]) for prompt in speculative.prompts.values()]
    assert row["mean_prompt_tokens"] == sum(sent) / 4 and len(set(sent)) > 1
    longest = max(map(len, prompt_ids))
    for argv in map(json.loads, (stand_in / "argv.jsonl").read_text().splitlines()):
        assert argv[argv.index("-np") + 1] == "2"
        assert int(argv[argv.index("-c") + 1]) == 2 * slot_context(longest, 12)


def test_a_timed_peer_run_cuts_its_streams_at_the_window_s_end(stand_in: Path, home: Path) -> None:
    sweep = SweepConfig(concurrency=(2,), max_tokens=2000, peer_llama_cpp=str(stand_in), llama_cpp_draft_max=())
    with load_peers(sweep, "tiny", "ngram", home)(PROMPTS, 2) as sends:
        started = time.perf_counter()
        # 2000 tokens at 2 ms each: every request is still streaming when the window closes
        run = run_load({}, "llama.cpp target-only", 2, PROMPTS, 2000, 0, duration_s=0.5, warmup_s=0.1,
                       send=sends["llama.cpp target-only"])  # fmt: skip
        elapsed = time.perf_counter() - started
    assert run.errors == [] and not run.outputs and run.counted_tokens > 0 and run.seconds == 0.5
    assert elapsed < 3.0  # cancelled, not awaited (the longer client's first request alone takes 4 s)


@pytest.mark.real_model
@pytest.mark.skipif(not (LLAMA_CPP_BIN / "llama-server").is_file(), reason=f"no llama.cpp build in {LLAMA_CPP_BIN}")
def test_the_real_llama_server_serves_the_closed_loop_with_several_slots() -> None:
    """The real llama-server on the smaller real GGUF, as its own draft: two slots, target-only and speculation."""
    model = "qwen2.5-coder-0.5b"
    sweep = SweepConfig(concurrency=(2,), max_tokens=16, peer_llama_cpp=str(LLAMA_CPP_BIN), llama_cpp_draft_max=(3,))
    with load_peers(sweep, model, model)(PROMPTS[:2], 2) as sends:
        runs = {mode: run_load({}, mode, 2, PROMPTS[:2], 16, 1, send=send) for mode, send in sends.items()}
    target_only, speculative = runs["llama.cpp target-only"], runs["llama.cpp draft-max=3"]
    assert not target_only.errors and not speculative.errors
    assert {len(output) for output in target_only.outputs.values()} == {16}
    assert speculative.summary(target_only)["acceptance_rate"] > 0.5  # its own draft: nearly all accepted
