"""`dtype=auto` on the CPU is bfloat16 only where the CPU has bfloat16 instructions: torch's own check says yes
on any AVX-512 CPU, where oneDNN emulates bfloat16 and a verification window costs 2-3x float32's."""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from specserve.models.config import cpu_computes_bfloat16
from specserve.models.loading import ModelConfig

BFLOAT16_FLAGS = {"avx512_bf16", "amx_bf16"}


def _x86_cpu_flags() -> set[str] | None:
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not cpuinfo.exists():
        return None
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def test_bfloat16_instructions_are_read_from_the_cpu() -> None:
    flags = _x86_cpu_flags()
    if flags is None:  # not x86 Linux: oneDNN's own check decides
        expected = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    else:
        expected = bool(flags & BFLOAT16_FLAGS)
    assert cpu_computes_bfloat16() == expected


def test_auto_dtype_follows_the_bfloat16_instructions() -> None:
    cpu = torch.device("cpu")
    expected = torch.bfloat16 if cpu_computes_bfloat16() else torch.float32
    assert ModelConfig("x").resolve_dtype(cpu) == expected
    assert ModelConfig("x", dtype="bfloat16").resolve_dtype(cpu) == torch.bfloat16  # asked for, never overridden
    assert ModelConfig("x").resolve_dtype(torch.device("cuda")) == torch.bfloat16
