"""The committed generated code matches protos/specserve.proto (regenerate with `make protos`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["specserve_pb2.py", "specserve_pb2.pyi", "specserve_pb2_grpc.py"]


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    (tmp_path / "protos").mkdir()
    shutil.copy(ROOT / "protos" / "specserve.proto", tmp_path / "protos" / "specserve.proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--pyi_out=.",
         "--grpc_python_out=.", "protos/specserve.proto"],
        cwd=tmp_path, check=True,
    )  # fmt: skip
    for name in GENERATED:
        fresh = (tmp_path / "protos" / name).read_text()
        committed = (ROOT / "protos" / name).read_text()
        assert fresh == committed, f"protos/{name} is stale: run `make protos`"


def test_package_is_versioned() -> None:
    from protos import specserve_pb2

    assert specserve_pb2.DESCRIPTOR.package == "specserve.v1"
    assert set(specserve_pb2.DESCRIPTOR.services_by_name) == {"Orchestrator", "Admin", "DraftService", "TargetService"}


def test_protos_holds_only_the_proto_and_its_generated_code() -> None:
    """Conversions live with their users (orchestrator/generation.py, specserve/worker/convert.py)."""
    present = {path.name for path in (ROOT / "protos").iterdir() if path.name != "__pycache__"}
    assert present == {"__init__.py", "specserve.proto", *GENERATED}
