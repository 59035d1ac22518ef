"""The llama.cpp engine (models/llama_cpp.py) on the tiny models written as float32 GGUF: its logits match
transformers', rollback and batching keep the cache right, and speculation over it is lossless, in process
and served."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
import torch

import target_service.worker
from inprocess.engine import SpeculativeEngine
from orchestrator.client import SpecServeClient
from specserve.config import GenerationRequest
from specserve.core.types import SamplingParams
from specserve.models.config import ModelConfig
from specserve.models.llama_cpp import (
    BINDING_VERSION,
    NATIVE_DIR,
    KVCacheFullError,
    LlamaCppModel,
    LlamaCppOptions,
    LlamaCppSequence,
    cpu_flags,
    native_library,
    sequences_for,
)
from specserve.models.loading import LoadedModel, load_model
from tests.helpers import always_accept, assert_divergence_is_near_tie, exact_joint, normalize, tv_bound, tv_distance
from tests.stack import LocalStack

PROMPTS = ["def f(", "hello world", "import os\n", "x", "The quick brown fox", "for i in range(10):\n"]
MAX_TOKENS = 40


def cpp_config(name: str) -> ModelConfig:
    return ModelConfig(name, device="cpu", engine="llama.cpp", kv_cache_tokens=4096)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("specserve-home")


@pytest.fixture(scope="module")
def cpp_target(home: Path) -> LoadedModel:
    return load_model(cpp_config("tiny"), home, progress=False)


@pytest.fixture(scope="module")
def cpp_engine(cpp_target: LoadedModel, home: Path) -> SpeculativeEngine:
    return SpeculativeEngine(cpp_target, load_model(cpp_config("tiny-draft"), home, progress=False))


def fresh_logits(model: LlamaCppModel, token_ids: list[int], num_logits: int) -> torch.Tensor:
    sequence = LlamaCppSequence(model, token_ids)
    try:
        return sequence.feed(num_logits)
    finally:
        sequence.release()


def test_logits_match_transformers(cpp_target: LoadedModel, tiny_target: LoadedModel) -> None:
    """The GGUF export and llama.cpp's Qwen2 graph compute the model transformers computes (llama.cpp keeps
    its KV cache in float16, hence the tolerance; a misnamed or transposed tensor is off by whole units)."""
    token_ids = [5, 17, 99, 200, 31, 64, 77, 12, 258, 3]
    assert isinstance(cpp_target.model, LlamaCppModel)
    ours = fresh_logits(cpp_target.model, token_ids, len(token_ids))
    with torch.inference_mode():
        reference = tiny_target.model(input_ids=torch.tensor([token_ids])).logits[0]
    assert ours.shape == reference.shape
    torch.testing.assert_close(ours, reference, atol=0.05, rtol=0.0)
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_rollback_removes_the_rejected_entries(cpp_target: LoadedModel) -> None:
    model = cpp_target.model
    assert isinstance(model, LlamaCppModel)
    sequence = LlamaCppSequence(model, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    sequence.feed(1)
    sequence.truncate(6)
    sequence.token_ids.extend([40, 41, 42])
    after_rollback = sequence.feed(3)
    sequence.release()
    expected = fresh_logits(model, [1, 2, 3, 4, 5, 6, 40, 41, 42], 3)
    torch.testing.assert_close(after_rollback, expected, atol=1e-3, rtol=0.0)


def test_one_pass_over_many_sequences_equals_separate_passes(cpp_target: LoadedModel) -> None:
    model = cpp_target.model
    assert isinstance(model, LlamaCppModel)
    prompts = [[9, 8, 7], [1, 2, 3, 4, 5, 6], [42]]
    sequences = [LlamaCppSequence(model, p) for p in prompts]
    batched = model.feed_batch(sequences, [2, 1, 1])
    for sequence in sequences:
        sequence.release()
    for prompt, logits, n in zip(prompts, batched, [2, 1, 1]):
        torch.testing.assert_close(logits, fresh_logits(model, prompt, n), atol=1e-3, rtol=0.0)


def test_sequence_ids_come_back_and_a_full_cache_is_a_clear_error(cpp_target: LoadedModel) -> None:
    model = LlamaCppModel(cpp_target.model.path, LlamaCppOptions(threads=1, kv_cache_tokens=256, max_sequences=2))
    first, second = LlamaCppSequence(model, [1]), LlamaCppSequence(model, [2])
    with pytest.raises(KVCacheFullError, match="sequences are in use"):
        LlamaCppSequence(model, [3])
    second.release()
    third = LlamaCppSequence(model, list(range(1, 256)) * 2)  # 510 tokens: more than the 256 cells
    with pytest.raises(KVCacheFullError, match="KV cache"):
        third.feed(1)
    third.truncate(0)
    third.token_ids.extend([4, 5])
    assert third.feed(1).shape == (1, model.vocab_size)  # a failed pass left nothing behind
    first.release()


def test_a_worker_holds_no_more_sessions_than_its_model_has_sequences(cpp_target: LoadedModel) -> None:
    """Each sequence the context may hold reserves a row of logits, so their number follows the cache (64 for
    the default 8192 cells, not llama.cpp's 256); past it the worker evicts its least recently used session
    (whose request prefills again) instead of failing the new one."""
    assert sequences_for(8192) == 64 and sequences_for(64) == 1 and sequences_for(10**6) == 256
    model = LlamaCppModel(cpp_target.model.path, LlamaCppOptions(threads=1, kv_cache_tokens=384, max_sequences=3))
    worker = target_service.worker.TargetWorker(dataclasses.replace(cpp_target, model=model), max_sessions=256)
    for i in range(5):
        worker.prefill(f"s{i}", [1, 2, 3 + i])
    worker.prefill("s4", [1, 2, 7])  # prefilled again: its old sequence is held until the new one is stored
    assert [f"s{i}" in worker.sessions for i in range(5)] == [False, False, False, True, True]


def test_a_native_build_is_used_only_on_a_cpu_that_has_its_instructions(tmp_path: Path) -> None:
    directory = tmp_path / NATIVE_DIR / BINDING_VERSION
    assert native_library(tmp_path) is None  # none built
    directory.mkdir(parents=True)
    (directory / "libllama.so").write_bytes(b"")
    (directory / "cpu_flags").write_text(" ".join(sorted(cpu_flags())[:3]))
    assert native_library(tmp_path) == directory / "libllama.so"
    (directory / "cpu_flags").write_text("avx2 an_instruction_set_no_cpu_has")
    assert native_library(tmp_path) is None
    with pytest.raises(ValueError, match="build_native_llama_cpp.sh"):
        load_model(dataclasses.replace(cpp_config("tiny"), llama_cpp_build="native"), tmp_path, progress=False)


def test_a_full_cache_is_resource_exhausted_on_the_wire() -> None:
    import grpc

    from specserve.rpc import status_for

    assert status_for(KVCacheFullError("the KV cache is full")) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_non_gguf_models_are_refused_with_the_reason(home: Path) -> None:
    with pytest.raises(ValueError, match="GGUF"):
        load_model(ModelConfig("Qwen/Qwen2.5-0.5B", device="cpu", engine="llama.cpp"), home, progress=False)


def test_auto_engine_keeps_torch_for_torch_formats() -> None:
    cpu = torch.device("cpu")
    assert ModelConfig("tiny").resolve_engine(cpu, gguf_source=False) == "torch"
    assert ModelConfig("qwen2.5-coder-1.5b", dtype="bfloat16").resolve_engine(cpu, gguf_source=True) == "torch"
    assert ModelConfig("qwen2.5-coder-1.5b", quantization="int4").resolve_engine(cpu, gguf_source=True) == "torch"
    assert ModelConfig("qwen2.5-coder-1.5b").resolve_engine(cpu, gguf_source=True) == "llama.cpp"
    assert ModelConfig("qwen2.5-coder-1.5b").resolve_engine(torch.device("cuda"), gguf_source=True) == "torch"


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculation_equals_target_only(cpp_engine: SpeculativeEngine, k: int) -> None:
    for prompt in PROMPTS:
        request = GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS, num_speculative_tokens=0)
        reference = cpp_engine.generate(request)
        speculative = cpp_engine.generate(dataclasses.replace(request, num_speculative_tokens=k))
        assert speculative.stats.num_rounds < len(speculative.token_ids)  # drafts were accepted: speculation ran
        prompt_ids = cpp_engine.tokenize(request)
        assert_divergence_is_near_tie(cpp_engine.target, prompt_ids, reference.token_ids, speculative.token_ids)


SAMPLING = SamplingParams(temperature=1.0, top_k=3)
NUM_RUNS = 2000


def sampled_joint(engine: SpeculativeEngine) -> Counter[tuple[int, ...]]:
    counts: Counter[tuple[int, ...]] = Counter()
    for run in range(NUM_RUNS):
        sampling = SamplingParams(temperature=SAMPLING.temperature, top_k=SAMPLING.top_k, seed=run)
        request = GenerationRequest(prompt="def f(", max_tokens=3, sampling=sampling, num_speculative_tokens=2)
        counts[tuple(engine.generate(request).token_ids)] += 1
    return counts


def test_sampling_follows_the_target_and_a_biased_sampler_fails(
    cpp_engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    joint = exact_joint(cpp_engine.target, "def f(", SAMPLING, 3)
    bound = tv_bound(joint, NUM_RUNS)
    tv = tv_distance(normalize(sampled_joint(cpp_engine)), joint)
    assert tv < bound, f"TV {tv:.4f} to the target's joint exceeds {bound:.4f}"
    monkeypatch.setattr(target_service.worker, "rejection_sample", always_accept)
    biased = tv_distance(normalize(sampled_joint(cpp_engine)), joint)
    assert biased > bound, f"accepting every draft gave TV {biased:.4f}, within {bound:.4f}: the test has no power"


def test_served_greedy_output_equals_target_only(cpp_engine: SpeculativeEngine) -> None:
    with LocalStack(engine="llama.cpp") as stack, SpecServeClient(stack.address, timeout_s=60) as client:
        for prompt in PROMPTS[:3]:
            request = GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS, num_speculative_tokens=0)
            reference, prompt_ids = cpp_engine.generate(request).token_ids, cpp_engine.tokenize(request)
            for k in (None, 4):  # None: adaptive k
                response = client.generate(prompt, max_tokens=MAX_TOKENS, num_speculative_tokens=k)
                assert_divergence_is_near_tie(cpp_engine.target, prompt_ids, reference, list(response.token_ids))
