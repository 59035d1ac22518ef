"""A replica whose process dies while loading (as one killed by Ray's memory monitor does) is restarted by
Ray up to max_load_failures times in a row, then given up: not restarted again, and reported with Ray's
cause in the log, `specserve scale` and /metrics. The stack itself keeps serving on its other replica."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.launcher import free_port
from tests.served import local_serve, wait_until_serving

MAX_LOAD_FAILURES = 3  # RoleConfig's default


def _dying_model(directory: Path, marker: Path) -> Path:
    """The tiny target as a Hugging Face directory whose modelling code (trust_remote_code) ends the process
    while the model is built, once `marker` exists: the same death, to Ray, as an out-of-memory kill."""
    from specserve.models import tiny
    from specserve.models.registry import TinySpec, get_preset

    preset = get_preset("tiny")
    assert preset is not None and isinstance(preset.source, TinySpec)
    tiny.build_model(preset.source).save_pretrained(directory, safe_serialization=True)
    tiny.build_tokenizer().save_pretrained(directory)
    (directory / "dying.py").write_text(
        "import os\n\nfrom transformers import Qwen2ForCausalLM\n\n\n"
        "class DyingForCausalLM(Qwen2ForCausalLM):\n"
        "    def __init__(self, config):\n"
        f"        if os.path.exists({str(marker)!r}):\n"
        "            os._exit(3)\n"
        "        super().__init__(config)\n"
    )
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "dying.DyingForCausalLM"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _metric(text: str, name: str, labels: str) -> float:
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_a_replica_that_keeps_dying_while_loading_is_given_up_and_reported(tmp_path: Path) -> None:
    marker = tmp_path / "die-while-loading"
    model = _dying_model(tmp_path / "dying-model", marker)
    port, http_port = free_port(), free_port()
    flags = ["--target", str(model), "--trust-remote-code", "--draft", "none", "--target-dtype", "float32",
             "--target-device", "cpu", "--port", str(port), "--http-port", str(http_port)]  # fmt: skip
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "hf-modules"))  # where transformers copies dying.py
    log_path = tmp_path / "serve.log"
    with local_serve(flags, log_path, env) as serve, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        wait_until_serving(port, serve)
        admin = pb_grpc.AdminStub(channel)
        marker.touch()  # from now on, a replica that loads dies while loading
        started = time.monotonic()
        admin.Scale(pb.ScaleRequest(target_replicas=2), timeout=60)
        deadline = time.monotonic() + 300
        while True:
            replicas = admin.ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set.replicas
            given_up = [r for r in replicas if r.state == "given_up"]
            if given_up:
                break
            assert serve.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        given_up_after_s = time.monotonic() - started
        (replica,) = given_up
        assert replica.role == "target" and replica.address == "specserve-target-1"
        assert "exit" in replica.detail.lower(), replica.detail  # Ray's account: the worker exited unexpectedly
        assert [r.state for r in replicas if r.role == "target" and r.state != "given_up"] == ["serving"]

        time.sleep(8)  # a restart and a load take longer than this here: one more would be counted by now
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
        assert _metric(metrics, "specserve_replica_load_failures_total", 'role="target"') == MAX_LOAD_FAILURES
        assert _metric(metrics, "specserve_replicas", 'role="target",state="given_up"') == 1
        assert _metric(metrics, "specserve_replicas", 'role="target",state="serving"') == 1

        scale = subprocess.run(
            [sys.executable, "-m", "specserve.cli", "scale", "--address", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert scale.returncode == 0, scale.stderr
        assert "target: 1 wanted, 1 serving" in scale.stdout, scale.stdout
        assert re.search(r"specserve-target-1 +given_up +not restarted: .*exit", scale.stdout, re.I), scale.stdout

        log = log_path.read_text(errors="replace")
        assert log.count("replica specserve-target-1 died while loading") == MAX_LOAD_FAILURES - 1, log[-5000:]
        assert re.search(r"ERROR deploy\.fleet: giving up on target replica specserve-target-1: it died while "
                         r"loading 3 times in a row", log), log[-5000:]  # fmt: skip
    print(f"\nfigure: a replica dying while loading was given up {given_up_after_s:.1f}s after it was added, "
          f"after {MAX_LOAD_FAILURES} deaths; reason: {replica.detail[:160]}")  # fmt: skip
