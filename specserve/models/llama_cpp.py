"""llama.cpp as a model engine: GGUF weights as published, run by llama.cpp's CPU kernels.

The library is the one the `xllamacpp` wheel ships (prebuilt for Linux, macOS and Windows, for a portable
instruction set), or the same llama.cpp version built for this CPU by scripts/build_native_llama_cpp.sh;
this module declares the few functions of llama.cpp's public C API (`llama.h`) it calls. Struct layouts
follow the header of the pinned wheel version, so the loader refuses any other version rather than guess.

One `LlamaCppModel` holds the weights and one context whose KV cache is shared by all sequences (a
sequence is a llama.cpp `seq_id`); `LlamaCppSequence` has the interface of `CachedSequence`, so the
workers' sessions, batching and rollback are the same code for both engines.
"""

from __future__ import annotations

import ctypes as C
import importlib.metadata
import importlib.util
import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specserve.models.pass_clock import model_pass
from specserve.models.pending import PendingTokens

logger = logging.getLogger(__name__)

BINDING_PACKAGE = "xllamacpp"
BINDING_VERSION = "2026.10.11549"  # the struct layouts below are this version's llama.h
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
SESSION_CELLS = 128  # KV cells a session is taken to hold at least: more sessions than the cache holds at that
# would not fit together, and each possible sequence reserves a row of logits (vocab x 4 bytes) up front
NATIVE_DIR = "llama.cpp-native"  # under the specserve home: BINDING_VERSION/libllama.so and the CPU it is for
_LOG_WARN, _LOG_ERROR = 3, 4  # ggml_log_level
_LOAD_MODE_READ = 0  # LLAMA_LOAD_MODE_NONE


class KVCacheFullError(MemoryError):
    """The shared KV cache has no room for this pass; the caller may retry when sessions end."""


class _ModelParams(C.Structure):
    _fields_ = [
        ("devices", C.c_void_p), ("tensor_buft_overrides", C.c_void_p), ("n_gpu_layers", C.c_int32),
        ("split_mode", C.c_int), ("load_mode", C.c_int), ("lazy_mode", C.c_int), ("main_gpu", C.c_int32),
        ("tensor_split", C.c_void_p), ("progress_callback", C.c_void_p), ("progress_callback_user_data", C.c_void_p),
        ("kv_overrides", C.c_void_p), ("vocab_only", C.c_bool), ("check_tensors", C.c_bool),
        ("use_extra_bufts", C.c_bool), ("no_host", C.c_bool), ("no_alloc", C.c_bool), ("load_mtp", C.c_bool),
    ]  # fmt: skip


class _ContextParams(C.Structure):
    _fields_ = [
        ("n_ctx", C.c_uint32), ("n_batch", C.c_uint32), ("n_ubatch", C.c_uint32), ("n_seq_max", C.c_uint32),
        ("n_rs_seq", C.c_uint32), ("n_outputs_max", C.c_uint32), ("n_outputs_max_per_seq", C.c_uint32),
        ("n_threads", C.c_int32), ("n_threads_batch", C.c_int32), ("ctx_type", C.c_int),
        ("rope_scaling_type", C.c_int), ("pooling_type", C.c_int), ("attention_type", C.c_int),
        ("flash_attn_type", C.c_int), ("rope_freq_base", C.c_float), ("rope_freq_scale", C.c_float),
        ("yarn_ext_factor", C.c_float), ("yarn_attn_factor", C.c_float), ("yarn_beta_fast", C.c_float),
        ("yarn_beta_slow", C.c_float), ("yarn_orig_ctx", C.c_uint32), ("defrag_thold", C.c_float),
        ("cb_eval", C.c_void_p), ("cb_eval_user_data", C.c_void_p), ("type_k", C.c_int), ("type_v", C.c_int),
        ("moe_cache_size", C.c_size_t), ("abort_callback", C.c_void_p), ("abort_callback_data", C.c_void_p),
        ("embeddings", C.c_bool), ("offload_kqv", C.c_bool), ("no_perf", C.c_bool), ("op_offload", C.c_bool),
        ("swa_full", C.c_bool), ("kv_unified", C.c_bool), ("samplers", C.c_void_p), ("n_samplers", C.c_size_t),
        ("ctx_other", C.c_void_p),
    ]  # fmt: skip


class _Batch(C.Structure):
    _fields_ = [
        ("n_tokens", C.c_int32), ("token", C.POINTER(C.c_int32)), ("embd", C.POINTER(C.c_float)),
        ("pos", C.POINTER(C.c_int32)), ("n_seq_id", C.POINTER(C.c_int32)),
        ("seq_id", C.POINTER(C.POINTER(C.c_int32))), ("logits", C.POINTER(C.c_int8)),
    ]  # fmt: skip


_LOG_CALLBACK = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)


def binding_available() -> bool:
    """The pinned llama.cpp wheel is installed."""
    return _installed_version() == BINDING_VERSION


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version(BINDING_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def _library_path() -> Path:
    version = _installed_version()
    if version != BINDING_VERSION:
        found = "not installed" if version is None else f"version {version} installed"
        raise RuntimeError(
            f"the llama.cpp engine needs {BINDING_PACKAGE}=={BINDING_VERSION} ({found}): "
            f"pip install {BINDING_PACKAGE}=={BINDING_VERSION}, or choose --engine torch"
        )
    spec = importlib.util.find_spec(BINDING_PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    libraries = sorted(Path(next(iter(spec.submodule_search_locations))).glob("xllamacpp*.so"))
    if not libraries:
        raise RuntimeError(f"{BINDING_PACKAGE} {version} ships no shared library for this platform")
    return libraries[0]


def native_library(home: Path) -> Path | None:
    """The libllama that scripts/build_native_llama_cpp.sh built from the pinned version's sources for this
    CPU, if there is one and this CPU has every instruction-set flag of the CPU it was built on (a home
    shared between machines may hold a build another CPU cannot run)."""
    directory = home / NATIVE_DIR / BINDING_VERSION
    library_path, flags_path = directory / "libllama.so", directory / "cpu_flags"
    if not library_path.is_file() or not flags_path.is_file():
        return None
    missing = set(flags_path.read_text().split()) - cpu_flags()
    if missing:
        logger.warning("not using %s: built on a CPU with %s, which this one lacks", library_path,
                       " ".join(sorted(missing)[:5]))  # fmt: skip
        return None
    return library_path


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            line = next((x for x in cpuinfo if x.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def _declare(lib: C.CDLL) -> None:
    signatures: dict[str, tuple[list, object]] = {
        "llama_backend_init": ([], None),
        "llama_log_set": ([_LOG_CALLBACK, C.c_void_p], None),
        "llama_model_default_params": ([], _ModelParams),
        "llama_context_default_params": ([], _ContextParams),
        "llama_model_load_from_file": ([C.c_char_p, _ModelParams], C.c_void_p),
        "llama_model_free": ([C.c_void_p], None),
        "llama_init_from_model": ([C.c_void_p, _ContextParams], C.c_void_p),
        "llama_free": ([C.c_void_p], None),
        "llama_model_get_vocab": ([C.c_void_p], C.c_void_p),
        "llama_vocab_n_tokens": ([C.c_void_p], C.c_int32),
        "llama_model_n_ctx_train": ([C.c_void_p], C.c_int32),
        "llama_batch_init": ([C.c_int32, C.c_int32, C.c_int32], _Batch),
        "llama_batch_free": ([_Batch], None),
        "llama_decode": ([C.c_void_p, _Batch], C.c_int32),
        "llama_get_logits": ([C.c_void_p], C.POINTER(C.c_float)),
        "llama_get_memory": ([C.c_void_p], C.c_void_p),
        "llama_memory_seq_rm": ([C.c_void_p, C.c_int32, C.c_int32, C.c_int32], C.c_bool),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype


@_LOG_CALLBACK
def _forward_log(level: int, text: bytes | None, _: object) -> None:
    if level in (_LOG_WARN, _LOG_ERROR) and text:  # its load reports are info: keep the worker's log readable
        logger.warning("llama.cpp: %s", text.decode(errors="replace").rstrip())


_library: C.CDLL | None = None
_library_lock = threading.Lock()


def library(native: Path | None = None) -> C.CDLL:
    """The llama.cpp library, loaded and initialised once per process: `native` (see native_library), else
    the wheel's. torch is imported first, so the library's libgomp resolves to the OpenMP runtime torch
    already loaded (one runtime, one thread team)."""
    global _library
    with _library_lock:
        if _library is None:
            path = native or _library_path()
            lib = C.CDLL(str(path), mode=C.RTLD_LOCAL)
            logger.info("llama.cpp library: %s", path)
            _declare(lib)
            lib.llama_log_set(_forward_log, None)
            lib.llama_backend_init()
            _library = lib
        return _library


@dataclass(frozen=True, slots=True)
class LlamaCppOptions:
    """How a llama.cpp context is sized."""

    threads: int
    """CPU threads for every pass."""
    kv_cache_tokens: int
    """KV cache cells shared by all sessions of the worker (ModelConfig.kv_cache_tokens)."""
    max_sequences: int = MAX_SEQUENCES
    """Sessions that can hold KV entries at once (`sequences_for` sizes it from the cache)."""
    batch_tokens: int = 512
    """Tokens per llama_decode call; longer passes (prompts) are split."""
    native_library: Path | None = None
    """The same llama.cpp built for this CPU (native_library); None: the wheel's portable build."""


def sequences_for(kv_cache_tokens: int) -> int:
    """The sessions a cache of `kv_cache_tokens` cells serves at once: 64 for the default 8192."""
    return max(1, min(MAX_SEQUENCES, kv_cache_tokens // SESSION_CELLS))


@dataclass(slots=True)
class _Row:
    """One sequence's part of a pass: tokens from position `start`, logits for the last `num_logits`."""

    seq_id: int
    token_ids: list[int]
    start: int
    num_logits: int


class LlamaCppModel:
    """GGUF weights and one llama.cpp context. Every call into the library holds `lock`."""

    def __init__(self, path: Path, options: LlamaCppOptions) -> None:
        self.lib = library(options.native_library)
        self.path, self.options = path, options
        self.lock = threading.Lock()
        params = self.lib.llama_model_default_params()
        # read, not mapped: llama.cpp repacks quantized weights for its kernels, and the mapped file's pages
        # stayed resident beside the repacked copy (0.6 GB more for the 1.5B target)
        params.load_mode = _LOAD_MODE_READ
        self._model = self.lib.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
        self.vocab_size = int(self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(self._model)))
        self.max_context = int(self.lib.llama_model_n_ctx_train(self._model))
        self._context = self._new_context(options)
        self._memory = self.lib.llama_get_memory(self._context)
        self._chunk_tokens = min(options.batch_tokens, options.kv_cache_tokens)  # llama.cpp's bound on a call
        self._batch = self.lib.llama_batch_init(self._chunk_tokens, 0, 1)
        self._free_ids = deque(range(options.max_sequences))
        self._released: deque[int] = deque()  # freed by finalizers (any thread); cleared under the lock
        weakref.finalize(self, _free_native, self.lib, self._model, self._context, self._batch)

    def _new_context(self, options: LlamaCppOptions) -> int:
        params = self.lib.llama_context_default_params()
        params.n_ctx = options.kv_cache_tokens
        params.n_batch = params.n_ubatch = min(options.batch_tokens, options.kv_cache_tokens)
        params.n_seq_max = options.max_sequences
        params.n_threads = params.n_threads_batch = options.threads
        params.kv_unified = True  # one pool of cells for all sessions, so one long prompt can use many
        params.no_perf = True
        context = self.lib.llama_init_from_model(self._model, params)
        if not context:
            raise MemoryError(f"llama.cpp could not create a context of {options.kv_cache_tokens} KV cells")
        return int(context)

    def acquire_sequence_id(self) -> int:
        with self.lock:
            self._clear_released()
            if not self._free_ids:
                raise KVCacheFullError(f"all {self.options.max_sequences} llama.cpp sequences are in use")
            return self._free_ids.popleft()

    def release_sequence_id(self, seq_id: int) -> None:
        """Called by finalizers, on any thread: the entries are cleared by the next call under the lock."""
        self._released.append(seq_id)

    def remove(self, seq_id: int, start: int) -> None:
        """Drop the sequence's KV entries from position `start` on."""
        with self.lock:
            self.lib.llama_memory_seq_rm(self._memory, seq_id, start, -1)

    def _clear_released(self) -> None:
        while self._released:
            seq_id = self._released.popleft()
            self.lib.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            self._free_ids.append(seq_id)

    def decode(self, rows: list[_Row]) -> list[torch.Tensor]:
        """One pass over every row's tokens (split into llama_decode calls of at most `batch_tokens`);
        float32 logits [num_logits, vocab] for each row. On failure no row keeps any of its new entries."""
        flat = [(row_index, token, row.start + i, i >= len(row.token_ids) - row.num_logits)
                for row_index, row in enumerate(rows) for i, token in enumerate(row.token_ids)]  # fmt: skip
        outputs: list[list[np.ndarray]] = [[] for _ in rows]
        with self.lock:
            self._clear_released()
            try:
                with model_pass():
                    for begin in range(0, len(flat), self._chunk_tokens):
                        self._decode_chunk(rows, flat[begin : begin + self._chunk_tokens], outputs)
            except BaseException:
                for row in rows:
                    self.lib.llama_memory_seq_rm(self._memory, row.seq_id, row.start, -1)
                raise
        return [torch.from_numpy(chunks[0] if len(chunks) == 1 else np.concatenate(chunks)) for chunks in outputs]

    def _decode_chunk(self, rows: list[_Row], chunk: list[tuple[int, int, int, bool]], outputs: list) -> None:
        batch = self._batch
        batch.n_tokens = len(chunk)
        for i, (row_index, token, position, wants_logits) in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0] = rows[row_index].seq_id
            batch.logits[i] = wants_logits
        status = self.lib.llama_decode(self._context, batch)
        if status == 1:
            raise KVCacheFullError(f"the KV cache ({self.options.kv_cache_tokens} tokens) is full")
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")
        with_logits = [row_index for row_index, _, _, wants in chunk if wants]
        if not with_logits:
            return
        pointer = self.lib.llama_get_logits(self._context)
        logits = np.ctypeslib.as_array(pointer, shape=(len(with_logits), self.vocab_size)).copy()
        start = 0
        for row_index in dict.fromkeys(with_logits):  # rows in batch order; each row's outputs are adjacent
            count = with_logits.count(row_index)
            outputs[row_index].append(logits[start : start + count])
            start += count

    def feed_batch(self, sequences: list[LlamaCppSequence], num_logits: list[int]) -> list[torch.Tensor]:
        """CachedSequence's batched feed: every sequence's pending tokens in one pass."""
        rows = [_Row(s.seq_id, s.token_ids[s.num_cached :], s.num_cached, n) for s, n in zip(sequences, num_logits)]
        logits = self.decode(rows)
        for sequence in sequences:
            sequence.num_cached = len(sequence.token_ids)
        return logits


def _free_native(lib: C.CDLL, model: int, context: int, batch: _Batch) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(context)
    lib.llama_model_free(model)


class LlamaCppSequence(PendingTokens):
    """CachedSequence on a llama.cpp model: tokens 0..num_cached-1 have KV entries under this sequence's id."""

    def __init__(self, model: LlamaCppModel, token_ids: list[int]) -> None:
        self.model = model
        self.token_ids = list(token_ids)
        self.num_cached = 0
        self.seq_id = model.acquire_sequence_id()
        self._release = weakref.finalize(self, model.release_sequence_id, self.seq_id)

    def feed(self, num_logits: int, upto: int | None = None) -> torch.Tensor:
        """Run the pending tokens (through `upto`) in one pass; logits [num_logits, vocab] of the last ones."""
        end = len(self.token_ids) if upto is None else upto
        assert self.num_cached < end <= len(self.token_ids) and 0 < num_logits <= end - self.num_cached
        row = _Row(self.seq_id, self.token_ids[self.num_cached : end], self.num_cached, num_logits)
        logits = self.model.decode([row])[0]
        self.num_cached = end
        return logits

    def truncate(self, num_tokens: int) -> None:
        """Keep the first `num_tokens` tokens: the one call that rolls back rejected positions."""
        assert 0 <= num_tokens <= len(self.token_ids)
        del self.token_ids[num_tokens:]
        if self.num_cached > num_tokens:
            self.model.remove(self.seq_id, num_tokens)
            self.num_cached = num_tokens

    def release(self) -> None:
        """Free the sequence id and its KV entries now rather than when collected."""
        self._release()
