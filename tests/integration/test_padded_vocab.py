"""The Qwen2.5-7B + 0.5B shape on tiny models: one tokenizer of 259 ids, logits 640 wide on the target and
576 on the draft, padding rows that outscore every token. Greedy output equals target-only exactly, sampled
output keeps the target's distribution, in process and served; a draft with another tokenizer is refused."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch
from transformers import PreTrainedTokenizerFast

import target_service.worker
from draft_service.worker import DraftWorker
from inprocess.engine import SpeculativeEngine
from orchestrator.client import SpecServeClient
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.bench.synthetic import lockstep
from specserve.config import GenerationRequest
from specserve.core.types import SamplingParams, Verdict
from specserve.models import tiny
from specserve.models.loading import LoadedModel, ModelConfig, load_model
from specserve.models.registry import TinySpec, get_preset
from specserve.models.slot_cache import SlotCacheConfig
from specserve.models.tokenizers import TokenizerMismatchError
from target_service.worker import TargetWorker
from tests.helpers import always_accept, exact_joint, normalize, tv_bound, tv_distance
from tests.stack import LocalStack

TARGET, DRAFT = "tiny-padded", "tiny-draft-padded"
NUM_TOKEN_IDS, TARGET_WIDTH, DRAFT_WIDTH = 259, 640, 576
PROMPTS = ["def fib(n):", "the cat sat on the mat", "a", "import numpy as np\n"]
SAMPLED_PROMPT = "def f("
SAMPLING = SamplingParams(temperature=1.0, top_k=3)  # 27 sequences of 3 tokens
K, NUM_TOKENS = 2, 3  # one round can emit accepted drafts, a recovered token and the bonus token


def load(name: str) -> LoadedModel:
    return load_model(ModelConfig(name, device="cpu", dtype="float32"), progress=False)


@pytest.fixture(scope="module")
def padded_target() -> LoadedModel:
    return load(TARGET)


@pytest.fixture(scope="module")
def padded_draft() -> LoadedModel:
    return load(DRAFT)


@pytest.fixture(scope="module")
def engine(padded_target: LoadedModel, padded_draft: LoadedModel) -> SpeculativeEngine:
    return SpeculativeEngine(padded_target, padded_draft, num_speculative_tokens=4)


@pytest.fixture(scope="module")
def joint(padded_target: LoadedModel) -> dict[tuple[int, ...], float]:
    """The target's exact joint of three sampled tokens, over its tokenizer's ids."""
    return exact_joint(padded_target, SAMPLED_PROMPT, SAMPLING, NUM_TOKENS)


def reference(engine: SpeculativeEngine, prompt: str, max_tokens: int = 40) -> list[int]:
    request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0)
    return engine.generate(request).token_ids


@torch.inference_mode()
def test_the_padding_would_win_without_the_mask(padded_target: LoadedModel, padded_draft: LoadedModel) -> None:
    """What makes the tests below able to fail: unmasked, both models choose a padding id everywhere here."""
    for loaded, width in ((padded_target, TARGET_WIDTH), (padded_draft, DRAFT_WIDTH)):
        assert (loaded.vocab_size, loaded.padded_vocab_size) == (NUM_TOKEN_IDS, width)
        for prompt in [*PROMPTS, SAMPLED_PROMPT]:
            input_ids = torch.tensor([loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            logits = loaded.model(input_ids=input_ids).logits[0]  # [prompt, padded vocab]
            assert bool((logits.argmax(dim=-1) >= NUM_TOKEN_IDS).all()), (loaded.name, prompt)
            top3 = logits[-1].topk(3).indices
            assert bool((top3 >= NUM_TOKEN_IDS).all()), "sampling's top 3 would be padding ids"


@pytest.mark.parametrize("draft_name", [DRAFT, "tiny-draft"])  # padded wider than its tokenizer by 317 or by 1
def test_greedy_output_equals_target_only(
    padded_target: LoadedModel, engine: SpeculativeEngine, draft_name: str
) -> None:
    speculative = engine if draft_name == DRAFT else SpeculativeEngine(padded_target, load(draft_name))
    num_accepted = 0
    for prompt in PROMPTS:
        expected = reference(engine, prompt)
        assert max(expected) < NUM_TOKEN_IDS
        for k in (1, 4, 8):
            request = GenerationRequest(prompt=prompt, max_tokens=40, num_speculative_tokens=k)
            result = speculative.generate(request)
            assert result.token_ids == expected, (draft_name, prompt, k)
            num_accepted += result.stats.num_accepted
    assert num_accepted > 0, "the draft never agreed: its padding or its tokens are wrong"


def test_a_draft_in_slots_masks_its_padding_too(padded_target: LoadedModel, padded_draft: LoadedModel) -> None:
    """The batched slot step (CUDA graphs on a GPU, eager here) chooses greedy drafts itself: no padding either."""
    target = TargetWorker(padded_target)
    prompts = [padded_target.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    reference_outputs, _, _, _ = lockstep(target, None, prompts, 0, 40, 0.0, None)
    in_slots = DraftWorker(padded_draft, slot_cache=SlotCacheConfig(enabled=True, slots=4, tokens_per_slot=512))
    outputs, _, proposed, accepted = lockstep(target, in_slots, prompts, 4, 40, 0.0, None)
    assert outputs == reference_outputs and 0 < accepted <= proposed


def sampled_joint(engine: SpeculativeEngine, num_runs: int) -> Counter[tuple[int, ...]]:
    counts: Counter[tuple[int, ...]] = Counter()
    for run in range(num_runs):
        sampling = dataclasses.replace(SAMPLING, seed=run)  # disjoint draft and target streams per seed
        request = GenerationRequest(prompt=SAMPLED_PROMPT, max_tokens=NUM_TOKENS, sampling=sampling,
                                    num_speculative_tokens=K)  # fmt: skip
        result = engine.generate(request)
        assert len(result.token_ids) == NUM_TOKENS, result
        counts[tuple(result.token_ids)] += 1
    return counts


def test_sampling_matches_the_target_joint(engine: SpeculativeEngine, joint: dict[tuple[int, ...], float]) -> None:
    num_runs = 3000
    tv, bound = tv_distance(normalize(sampled_joint(engine, num_runs)), joint), tv_bound(joint, num_runs)
    assert tv < bound, f"TV {tv:.4f} of {num_runs} speculative samples to the target's joint exceeds {bound:.4f}"


@pytest.mark.parametrize("biased", [always_accept])
def test_the_check_has_power_against_a_biased_sampler(
    engine: SpeculativeEngine,
    joint: dict[tuple[int, ...], float],
    monkeypatch: pytest.MonkeyPatch,
    biased: Callable[..., Verdict],
) -> None:
    monkeypatch.setattr(target_service.worker, "rejection_sample", biased)
    num_runs = 1500
    tv, bound = tv_distance(normalize(sampled_joint(engine, num_runs)), joint), tv_bound(joint, num_runs)
    assert tv > bound, f"{biased.__name__} got TV {tv:.4f} within {bound:.4f}: the check has no power"


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(target=TARGET, draft=DRAFT) as running:
        yield running


def test_the_workers_report_their_widths_and_the_shared_vocabulary(stack: LocalStack) -> None:
    infos = {}
    for role, stub in (("target", pb_grpc.TargetServiceStub), ("draft", pb_grpc.DraftServiceStub)):
        with grpc.insecure_channel(stack.addresses[role]) as channel:
            infos[role] = stub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=5)
    assert (infos["target"].vocab_size, infos["target"].padded_vocab_size) == (NUM_TOKEN_IDS, TARGET_WIDTH)
    assert (infos["draft"].vocab_size, infos["draft"].padded_vocab_size) == (NUM_TOKEN_IDS, DRAFT_WIDTH)
    assert infos["target"].tokenizer_fingerprint == infos["draft"].tokenizer_fingerprint


def test_served_greedy_output_equals_target_only(stack: LocalStack, engine: SpeculativeEngine) -> None:
    with SpecServeClient(stack.address, timeout_s=60) as client:
        num_accepted = 0
        for prompt in PROMPTS:
            for k in (None, 4):  # None: adaptive k
                response = client.generate(prompt, max_tokens=40, num_speculative_tokens=k)
                assert list(response.token_ids) == reference(engine, prompt), (prompt, k)
                num_accepted += response.stats.accepted
        assert num_accepted > 0


def test_served_sampling_matches_the_target_joint(stack: LocalStack, joint: dict[tuple[int, ...], float]) -> None:
    """The draft's sparse distributions cross the wire and meet the target's over the same 259 ids."""
    num_runs = 1500
    counts: Counter[tuple[int, ...]] = Counter()
    with SpecServeClient(stack.address, timeout_s=60) as client:
        for seed in range(num_runs):
            response = client.generate(SAMPLED_PROMPT, max_tokens=NUM_TOKENS, temperature=1.0, top_k=3, seed=seed,
                                       num_speculative_tokens=K)  # fmt: skip
            counts[tuple(response.token_ids)] += 1
    tv, bound = tv_distance(normalize(counts), joint), tv_bound(joint, num_runs)
    assert tv < bound, f"TV {tv:.4f} of {num_runs} served samples to the target's joint exceeds {bound:.4f}"


def with_extra_token() -> PreTrainedTokenizerFast:
    tokenizer = tiny.build_tokenizer()
    tokenizer.add_tokens(["<|extra|>"])  # id 259: one more token id than the target's tokenizer has
    return tokenizer


def test_a_draft_with_another_tokenizer_is_refused_naming_the_difference(
    padded_target: LoadedModel, padded_draft: LoadedModel
) -> None:
    draft = dataclasses.replace(padded_draft, tokenizer=with_extra_token())
    with pytest.raises(TokenizerMismatchError, match=r"1 only in draft \(e\.g\. \['<\|extra\|>'\]\)"):
        SpeculativeEngine(padded_target, draft)


def test_the_orchestrator_refuses_a_served_draft_with_another_tokenizer(tmp_path: Path) -> None:
    preset = get_preset(DRAFT)
    assert preset is not None and isinstance(preset.source, TinySpec)
    directory = tmp_path / "other-tokenizer"
    tiny.build_model(dataclasses.replace(preset.source, derived_from=None)).save_pretrained(directory)
    with_extra_token().save_pretrained(directory)
    with pytest.raises(TokenizerMismatchError, match="different tokenizers .*260 vs 259 token ids"):
        with LocalStack(target=TARGET, draft=str(directory)):
            pass
