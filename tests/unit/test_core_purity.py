"""specserve.core is pure: importing it pulls in no model library, transport, placement or protos. And the
transport (specserve.rpc) runs no model: it loads no model library and not the worker runtime's model thread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("transformers", "grpc", "ray", "protos", "specserve.models", "draft_service", "target_service")
NOT_TRANSPORT = ("torch", "transformers", "numpy", "ray", "specserve.openmp", "specserve.worker.executor",
                 "specserve.worker.batching", "protos")  # fmt: skip

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
forbidden = json.loads(sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))))
"""


def imported_forbidden(module: str, forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    """The `forbidden` modules that importing `module` in a fresh interpreter loads."""
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, module, json.dumps(forbidden)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_core_imports_nothing_forbidden() -> None:
    loaded = imported_forbidden("specserve.core")
    assert loaded == [], f"importing specserve.core loaded {loaded}"


def test_the_probe_sees_a_forbidden_import() -> None:
    loaded = imported_forbidden("specserve.models.tiny")  # imports transformers by design
    assert "transformers" in loaded, f"the probe missed transformers: {loaded}"


def test_the_transport_runs_no_model() -> None:
    loaded = imported_forbidden("specserve.rpc", NOT_TRANSPORT)
    assert loaded == [], f"importing specserve.rpc loaded {loaded}"
