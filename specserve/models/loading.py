"""Load a model + tokenizer by preset name, Hugging Face id or local directory.

GGUF presets are dequantized once into a safetensors cache (memory-mapped on later loads), since
transformers dequantizes every GGUF tensor in Python on each load.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specserve.models import tiny
from specserve.models.attention import ATTENTION
from specserve.models.config import DTYPE_NAMES, ModelConfig, default_home
from specserve.models.fetch import ArtifactError, ensure_gguf, sha256_file
from specserve.models.gguf_export import write_qwen2_gguf
from specserve.models.lean import LeanDecoder, lean_decoder, unsupported_reason
from specserve.models.llama_cpp import NATIVE_DIR, LlamaCppModel, LlamaCppOptions, native_library, sequences_for
from specserve.models.packing import pack_linears
from specserve.models.quantized import quantize_int4, quantize_int8
from specserve.models.registry import Preset, SplitGGUF, TinySpec, get_preset
from specserve.models.tokenizers import tokenizer_vocab_size

logger = logging.getLogger(__name__)

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
MANIFEST = "specserve-manifest.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    name: str
    model: PreTrainedModel | LlamaCppModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    max_context: int
    eos_token_ids: frozenset[int]
    load_s: float
    vocab_size: int = field(init=False)
    """The ids this model reads and emits: its tokenizer's. Logits past them are padding, never chosen."""

    def __post_init__(self) -> None:
        # once: get_vocab() builds a dict of the whole vocabulary. A model built without a tokenizer (the
        # synthetic benchmarks) counts every row as a token.
        vocab_size = tokenizer_vocab_size(self.tokenizer) if self.tokenizer is not None else self.padded_vocab_size
        object.__setattr__(self, "vocab_size", vocab_size)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and the logits: vocab_size plus padding (152,064 for Qwen2.5-7B's 151,665 ids)."""
        if isinstance(self.model, LlamaCppModel):
            return self.model.vocab_size
        return int(self.model.config.vocab_size)

    @property
    def engine(self) -> str:
        return "llama.cpp" if isinstance(self.model, LlamaCppModel) else "torch"

    @property
    def decoder(self) -> LeanDecoder | None:
        """The lean one-sequence forward pass over this model (models/lean.py), where it supports it."""
        return None if isinstance(self.model, LlamaCppModel) else lean_decoder(self.model)


def cpu_threads(role: str, requested: int | None = None) -> int:
    """Torch threads for a worker's CPU inference: `requested`, else every core for a target and a quarter
    of them (at least one) for a draft. On one machine the two share the cores, and a draft on all of
    them slows the target's passes it overlaps with (measured on 2 cores: one draft thread gave 7.7 tok/s
    at one client, two gave 6.6)."""
    if requested is not None:
        return requested
    cores = os.cpu_count() or 1
    return max(1, cores // 4) if role == "draft" else cores


def load_model(config: ModelConfig, home: Path | None = None, progress: bool = True) -> LoadedModel:
    started = time.perf_counter()
    home = home or default_home()
    device = config.resolve_device()
    preset = get_preset(config.name)
    tiny_preset = preset is not None and isinstance(preset.source, TinySpec)
    gguf_source = (preset is not None and isinstance(preset.source, SplitGGUF)) or config.name.endswith(".gguf")
    if config.resolve_engine(device, gguf_source) == "llama.cpp":
        return _load_llama_cpp(config, preset, home, progress, started)
    quantization = config.resolve_quantization(device)
    if quantization == "int8" or (tiny_preset and config.dtype == "auto"):
        dtype = torch.float32  # int8 kernels take float32 activations; tiny models exist for exact fp32 tests
    elif quantization == "int4" and config.dtype == "auto":
        dtype = torch.bfloat16  # the int4 kernel's activations
    else:
        dtype = config.resolve_dtype(device)
    if tiny_preset:
        assert preset is not None and isinstance(preset.source, TinySpec)
        model, tokenizer = _build_tiny(preset.source), tiny.build_tokenizer()
        model = model.to(device=device, dtype=dtype)
    else:
        directory = ensure_converted(preset, home, progress) if preset is not None else config.name
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=config.trust_remote_code)
        # a replica given several GPUs (Ray sets CUDA_VISIBLE_DEVICES) splits its layers over all of them
        spans_gpus = config.device == "auto" and device.type == "cuda" and torch.cuda.device_count() > 1
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=dtype, device_map="auto" if spans_gpus else str(device), use_safetensors=True,
            trust_remote_code=config.trust_remote_code,
        )  # fmt: skip
        if device.type == "cpu":
            _make_resident(model)
    model.eval()
    if config.few_query_attention and device.type == "cpu" and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(ATTENTION)
    if quantization == "int8":
        model = quantize_int8(model, device)
    elif quantization == "int4":
        num_int4 = quantize_int4(model, device)
        logger.info("%s: %d Linear layers in int4 (and int8), the rest in int8", config.name, num_int4)
    elif config.pack_weights and device.type == "cpu":
        pack_linears(model)
    gc.collect()  # conversion and quantization leave float32 copies in reference cycles; free them now
    _return_freed_memory()
    loaded = LoadedModel(
        name=config.name,
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        max_context=int(getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length),
        eos_token_ids=_eos_token_ids(model, tokenizer, preset.extra_eos_tokens if preset else ()),
        load_s=time.perf_counter() - started,
    )
    logger.info("loaded %s on %s in %s in %.1fs", config.name, device, str(dtype), loaded.load_s)
    if (why_not := unsupported_reason(model)) is not None:
        logger.info("%s runs transformers' forward pass (the lean pass does not support its %s)", config.name, why_not)
    return loaded


def _load_llama_cpp(
    config: ModelConfig, preset: Preset | None, home: Path, progress: bool, started: float
) -> LoadedModel:
    """The model's GGUF file run by llama.cpp (models/llama_cpp.py), with torch's thread count."""
    if config.resolve_device().type != "cpu":
        raise ValueError("the llama.cpp engine runs on the CPU; choose --engine torch for a GPU")
    if preset is not None and isinstance(preset.source, TinySpec):
        path, tokenizer = tiny_gguf(preset, home), tiny.build_tokenizer()
    elif preset is not None:
        assert isinstance(preset.source, SplitGGUF)
        path = ensure_gguf(preset.source, home / "gguf", progress)
        tokenizer = AutoTokenizer.from_pretrained(ensure_tokenizer(preset, home, progress))
    elif config.name.endswith(".gguf") and Path(config.name).is_file():
        path = Path(config.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    else:
        raise ValueError(f"the llama.cpp engine runs GGUF files: a GGUF preset or a path to a .gguf file, not "
                         f"{config.name!r}; choose --engine torch for a Hugging Face model")  # fmt: skip
    cells = config.kv_cache_tokens
    options = LlamaCppOptions(torch.get_num_threads(), kv_cache_tokens=cells, max_sequences=sequences_for(cells),
                              native_library=_llama_cpp_build(config.llama_cpp_build, home))  # fmt: skip
    model = LlamaCppModel(path, options)
    extra = preset.extra_eos_tokens if preset else ()
    eos = {int(tokenizer.convert_tokens_to_ids(token)) for token in extra}
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    loaded = LoadedModel(
        name=config.name,
        model=model,
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        dtype=torch.float32,  # the logits' dtype; weights keep the GGUF file's types
        max_context=min(model.max_context, config.kv_cache_tokens),
        eos_token_ids=frozenset(eos),
        load_s=time.perf_counter() - started,
    )
    logger.info("loaded %s (%s) with llama.cpp in %.1fs", config.name, path.name, loaded.load_s)
    return loaded


def _llama_cpp_build(build: str, home: Path) -> Path | None:
    """The native library `build` asks for (ModelConfig.llama_cpp_build); None: the wheel's."""
    if build == "wheel":
        return None
    native = native_library(home)
    if native is None and build == "native":
        raise ValueError(f"no llama.cpp build for this CPU under {home / NATIVE_DIR}: run "
                         "scripts/build_native_llama_cpp.sh, or choose --llama-cpp-build auto")  # fmt: skip
    return native


def tiny_gguf(preset: Preset, home: Path) -> Path:
    """The tiny test model as a float32 GGUF file, written once per spec."""
    spec = preset.source
    assert isinstance(spec, TinySpec)
    base = get_preset(spec.derived_from) if spec.derived_from else None
    digest = hashlib.sha256(repr((spec, base.source if base else None)).encode()).hexdigest()[:16]
    path = home / "gguf" / f"{preset.name}-{digest}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_qwen2_gguf(_build_tiny(spec), path)
    return path


def ensure_tokenizer(preset: Preset, home: Path, progress: bool = True) -> Path:
    """The preset's tokenizer files, read once from its verified GGUF (no weights are converted)."""
    assert isinstance(preset.source, SplitGGUF)
    directory = home / "tokenizers" / preset.name
    stamp = directory / "source_sha256"
    if stamp.is_file() and stamp.read_text() == preset.source.sha256:
        return directory
    gguf = ensure_gguf(preset.source, home / "gguf", progress)
    staging = directory.with_name(directory.name + f".{os.getpid()}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
    (staging / "source_sha256").write_text(preset.source.sha256)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    return directory


def _return_freed_memory() -> None:
    """Give the heap memory the load freed (float32 copies, unpacked weights) back to the system: glibc
    keeps it for reuse otherwise, and a loaded 1.5B target stayed at 6.7 GB resident instead of 3.95."""
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return
    malloc_trim(0)


@torch.no_grad()
def _make_resident(model: PreTrainedModel) -> None:
    """Copy memory-mapped weights into process memory.

    Mapped weights are page cache, which the kernel may drop when cold (seen here: a pageout scheme
    evicts file pages idle for 60 s), and the next pass after an idle minute re-reads them from disk.
    """
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.data = tensor.data.clone()


def load_tokenizer(name: str, home: Path | None = None, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer alone (the orchestrator tokenizes and detokenizes; it holds no weights)."""
    preset = get_preset(name)
    if preset is not None and isinstance(preset.source, TinySpec):
        return tiny.build_tokenizer()
    directory = ensure_tokenizer(preset, home or default_home()) if preset is not None else name
    return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)


def _build_tiny(spec: TinySpec) -> PreTrainedModel:
    base = None
    if spec.derived_from is not None:
        base_preset = get_preset(spec.derived_from)
        assert base_preset is not None and isinstance(base_preset.source, TinySpec)
        base = tiny.build_model(base_preset.source)
    return tiny.build_model(spec, base)


def _eos_token_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, extra: tuple[str, ...]
) -> frozenset[int]:
    ids = {int(tokenizer.convert_tokens_to_ids(token)) for token in extra}
    for source in (
        model.config.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return frozenset(ids)


def ensure_converted(preset: Preset, home: Path, progress: bool = True) -> Path:
    """The preset's safetensors directory, converting its verified GGUF on first use."""
    assert isinstance(preset.source, SplitGGUF)
    spec = preset.source
    directory = home / "models" / preset.name
    if _manifest_ok(directory, spec):
        return directory
    gguf = ensure_gguf(spec, home / "gguf", progress)
    started = time.perf_counter()
    logger.info("converting %s to safetensors (once; later loads are memory-mapped)", gguf.name)
    staging = directory.with_name(directory.name + ".converting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(staging / WEIGHTS), metadata={"format": "pt", "source_sha256": spec.sha256})
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.quantization_config = None
    del config.quantization_config  # the weights are dequantized now
    config.save_pretrained(staging)
    model.generation_config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    manifest = {
        "source": spec.filename,
        "source_sha256": spec.sha256,
        "files": {WEIGHTS: {"sha256": sha256_file(staging / WEIGHTS), **_stamp(staging / WEIGHTS)}},
        "convert_s": round(time.perf_counter() - started, 1),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    logger.info("converted %s in %.1fs", gguf.name, manifest["convert_s"])
    return directory


def _stamp(path: Path) -> dict[str, int]:
    """What identifies the file's content as last hashed: any write changes its ctime, which no one can set."""
    stat = path.stat()
    return {"size": stat.st_size, "inode": stat.st_ino, "ctime_ns": stat.st_ctime_ns}


def _manifest_ok(directory: Path, spec: SplitGGUF) -> bool:
    """True when the converted files are those the manifest recorded: sha256-verified before every load,
    re-hashed only when a file changed since it was last hashed (a 1.5B model hashes in ~10 s here)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("source_sha256") != spec.sha256:
        return False
    rehashed = False
    for name, entry in manifest["files"].items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != entry["size"]:
            logger.warning("%s is missing or truncated; converting again", path)
            return False
        stamp = _stamp(path)
        if all(entry.get(key) == value for key, value in stamp.items()):
            continue
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            logger.warning("%s has sha256 %s, not the recorded %s; refusing it, converting again", path, digest,
                           entry["sha256"])  # fmt: skip
            return False
        entry.update(stamp)
        rehashed = True
    if rehashed:
        staged = directory / (MANIFEST + ".tmp")
        try:
            staged.write_text(json.dumps(manifest, indent=2))
            os.replace(staged, directory / MANIFEST)
        except OSError:  # a read-only cache (an image layer): verified now, hashed again next time
            logger.info("cannot record the verification in %s; the next load hashes again", directory)
    return True


def verify_converted(preset: Preset, home: Path) -> None:
    """Re-hash the converted weights against the manifest (`specserve models verify`)."""
    directory = home / "models" / preset.name
    manifest = json.loads((directory / MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        digest = sha256_file(directory / name, progress=True)
        if digest != entry["sha256"]:
            raise ArtifactError(f"{directory / name}: sha256 {digest} != recorded {entry['sha256']}")
