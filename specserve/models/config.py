"""Which model to load, where and how, by name: ModelConfig and the names its fields take. No torch here:
the CLI builds its flags and checks its input from this module before anything heavy is imported."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specserve.flags import flag

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8", "int4", "auto")
ENGINES = ("auto", "torch", "llama.cpp")
LLAMA_CPP_BUILDS = ("auto", "wheel", "native")
ROLE_QUANTIZATION = {"draft": "auto", "target": "none"}
"""A role's quantization unless its config says: a draft's proposals may be approximate, a target's not."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model to load, where and how."""

    name: str = field(metadata=flag("--model", metavar="NAME"))
    """A preset name (`specserve models list`), a Hugging Face model id, or a local directory."""
    device: str = field(default="auto", metadata=flag(metavar="DEVICE"))
    """`auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`."""
    dtype: str = field(default="auto", metadata=flag(choices=("auto", *DTYPE_NAMES)))
    """`auto`, `float32`, `bfloat16`, `float16`. `auto` is bfloat16 on CUDA and on CPUs with native bfloat16
    matmul (AMX/AVX512-BF16: measured 1.3x faster decode than float32 for the 1.5B target), else float32:
    on AVX-512 without BF16 instructions oneDNN emulates bfloat16, and there the 1.5B target's 5-token
    window took 700 ms in bfloat16 against 280 ms in float32 (its step 210 against 228 ms)."""
    trust_remote_code: bool = False
    """Run modelling code shipped with a Hugging Face model. Off unless explicitly asked for."""
    quantization: str = field(default="none", metadata=flag(choices=QUANTIZATIONS))
    """`none`, `int8` (dynamic int8 weights for every Linear layer, CPU only), `int4` (int4 weights for decode
    steps, int8 for longer passes, bfloat16 activations; CPU only: models/quantized.py), or `auto` (int4 on
    AVX-512 CPUs, int8 on other CPUs, none on GPUs). Meant for drafts, whose proposals may be
    approximate without changing the output: measured here, the 0.5B draft's step drops from 104 ms
    (float32) to 46 ms in int8, and int4 takes a further 0.77x (in process, k = 8: 1.19x the tokens/s)."""
    few_query_attention: bool = True
    """On the CPU: passes over few positions (decode steps, verification windows) pack the query heads that
    share a key/value head into one attention (models/attention.py; measured: a bfloat16 1.5B target layer,
    one query against 1,000 cached tokens, 0.12 ms against 1.7 ms). Off: attention as transformers ships it."""
    pack_weights: bool = True
    """On the CPU in bfloat16 or float32: pack Linear weights once, at load, in oneDNN's layout
    (models/packing.py; each layer's outputs checked against the plain layer's, bit for bit in bfloat16;
    measured: the 1.5B target's decode step in bfloat16 175 -> 139 ms on an AMX Xeon; in float32 on a
    2-core AVX2 EPYC, a decode step 541 -> 472 ms and a 5-token window 1607 -> 627 ms)."""
    engine: str = field(default="auto", metadata=flag(choices=ENGINES))
    """What runs the passes: `torch` (transformers' model in the dtype and quantization above), `llama.cpp`
    (the GGUF file's own weights and llama.cpp's CPU kernels: GGUF presets, a `.gguf` path, or the tiny test
    models written as float32 GGUF), or `auto`: llama.cpp for a GGUF model on the CPU when neither `dtype`
    nor `quantization` asks for a torch format, else torch."""
    kv_cache_tokens: int = 8192
    """llama.cpp engine: KV cache cells shared by all sessions of a worker (one cell per token per session)."""
    llama_cpp_build: str = field(default="auto", metadata=flag(choices=LLAMA_CPP_BUILDS))
    """llama.cpp engine: `wheel` (the `xllamacpp` wheel's portable build), `native` (the same version built
    for this CPU by scripts/build_native_llama_cpp.sh, 2-5 minutes on two cores), or `auto`: native
    where it was built for this CPU, else the wheel's."""

    @classmethod
    def for_role(cls, role: str, name: str) -> ModelConfig:
        """`name` with the role's defaults (ROLE_QUANTIZATION)."""
        return cls(name, quantization=ROLE_QUANTIZATION[role])

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.llama_cpp_build not in LLAMA_CPP_BUILDS:
            raise ValueError(f"llama_cpp_build must be one of {LLAMA_CPP_BUILDS}, got {self.llama_cpp_build!r}")
        if self.kv_cache_tokens < 256:
            raise ValueError(f"kv_cache_tokens must be >= 256, got {self.kv_cache_tokens}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if not self.name:
            raise ValueError("model name must not be empty")
        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    def resolve_device(self) -> torch.device:
        """Where inputs go: with several GPUs visible, the first (the model spans them all)."""
        import torch

        if self.device == "auto":
            return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            native_bf16 = device.type == "cuda" or cpu_computes_bfloat16()
            return torch.bfloat16 if native_bf16 else torch.float32
        dtype: torch.dtype = getattr(torch, self.dtype)  # a name of DTYPE_NAMES, checked at construction
        return dtype

    def resolve_engine(self, device: torch.device, gguf_source: bool) -> str:
        """The engine `auto` stands for, given where the model runs and whether its weights are GGUF."""
        if self.engine != "auto":
            return self.engine
        from specserve.models.llama_cpp import binding_available

        torch_format = self.dtype != "auto" or self.quantization not in ("auto", "none")
        if device.type == "cpu" and gguf_source and not torch_format and binding_available():
            return "llama.cpp"
        return "torch"

    def resolve_quantization(self, device: torch.device) -> str:
        if self.quantization == "auto":
            if device.type != "cpu":
                return "none"
            from specserve.models.quantized import int4_supported

            return "int4" if int4_supported() else "int8"
        return self.quantization


def cpu_computes_bfloat16() -> bool:
    """The CPU has bfloat16 instructions (x86: AVX512-BF16 or AMX; elsewhere oneDNN's own check).
    `torch.ops.mkldnn._is_mkldnn_bf16_supported()` says yes on any AVX-512 CPU, where oneDNN converts
    bfloat16 to float32 around float32 arithmetic and a window of several tokens costs 2-3x float32's."""
    import torch

    cpu = torch.cpu
    if hasattr(cpu, "_is_avx512_bf16_supported") and cpu._is_avx512_supported():
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def default_home() -> Path:
    """`SPECSERVE_HOME`, else `$XDG_CACHE_HOME/specserve`, else `~/.cache/specserve`."""
    if home := os.environ.get("SPECSERVE_HOME"):
        return Path(home)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "specserve"
