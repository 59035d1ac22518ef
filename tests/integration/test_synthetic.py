"""The synthetic benchmark on the CPU with small shapes: the controlled draft hits the acceptance it is
told to, and outputs stay identical to target-only (verification is the real one)."""

from __future__ import annotations

import pytest
import torch

from draft_service.worker import DraftWorker
from specserve.bench.lossless import ReferenceDecoder, first_divergence
from specserve.bench.synthetic import (
    Point,
    build,
    check_draft_steps,
    draft_step_ms,
    drafts_of,
    lockstep,
    main,
    measure,
    near_tie_partings,
    target_only_continuations,
    verify_ms,
)
from specserve.models.step_graphs import StepGraphs
from target_service.worker import TargetWorker


@pytest.fixture(scope="module")
def workers() -> tuple[TargetWorker, DraftWorker]:
    cpu = torch.device("cpu")
    return TargetWorker(build("tiny", cpu, torch.float32, seed=1, predictable=True)), DraftWorker(
        build("tiny-draft", cpu, torch.float32, 2)
    )


# accepted / proposed for k = 4 with each draft right with probability alpha: (a + a^2 + a^3 + a^4) / 4
@pytest.mark.parametrize(("alpha", "low", "high"), [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.7, 0.35, 0.55)])
def test_the_draft_is_accepted_as_often_as_told(workers: tuple, alpha: float, low: float, high: float) -> None:
    target, draft = workers
    prompts = [[(5 * i + j) % 200 for j in range(12)] for i in range(4)]
    references = target_only_continuations(target, prompts, 48)
    outputs, seconds, proposed, accepted = lockstep(target, draft, prompts, 4, 48, alpha, references, seed=3)
    assert outputs == references  # float32: batched verification changes nothing here
    assert low <= accepted / proposed <= high and seconds > 0


def test_a_predictable_target_continues_with_successors_that_bfloat16_passes_agree_on() -> None:
    cpu = torch.device("cpu")
    target = TargetWorker(build("tiny", cpu, torch.bfloat16, seed=5, predictable=True))
    draft = DraftWorker(build("tiny-draft", cpu, torch.bfloat16, seed=6))
    successor = torch.randperm(260, generator=torch.Generator().manual_seed(5))
    prompts = [[(11 * i + 3 * j) % 260 for j in range(20)] for i in range(4)]
    references = target_only_continuations(target, prompts, 24)
    assert all(r[j + 1] == int(successor[r[j]]) for r in references for j in range(len(r) - 1))
    outputs, _, proposed, accepted = lockstep(target, draft, prompts, 6, 24, 1.0, references)
    assert outputs == references and accepted == proposed > 0


def test_measure_and_the_command(workers: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    target, _ = workers
    drafts = drafts_of(build("tiny-draft", torch.device("cpu"), torch.float32, 2), ["slots", "growing"])
    points = [Point(0.9, 2, 1), Point(0.9, 2, 3), Point(0.9, 2, 3, "growing")]
    rows = list(measure(target, drafts, points, prompt_len=8, max_tokens=16))
    assert [(r["concurrency"], r["k"], r.get("draft_cache")) for r in rows] == [
        (1, 0, None), (1, 2, "slots"), (3, 0, None), (3, 2, "slots"), (3, 2, "growing")
    ]  # fmt: skip
    assert all(r["identical_to_target_only"] == r["concurrency"] for r in rows if r["k"])
    assert 0 < draft_step_ms(drafts["slots"], 3, prompt_len=8) and len(drafts["slots"].sessions) == 0
    assert 0 < verify_ms(target, 3, window=5, prompt_len=8) and len(target.sessions) == 0
    args = ["--target", "tiny", "--draft", "tiny-draft", "--device", "cpu", "--dtype", "float32", "--alphas", "0.8",
            "--ks", "2", "--concurrency", "2", "--prompt-len", "8", "--max-tokens", "8",
            "--draft-caches", "slots", "growing", "--compare-k", "3", "--step-times", "2",
            "--verify-times", "2", "--check-draft-steps", "3"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| 2 | 0.80 | 2 | slots |" in out and "| 2 | 0.80 | 3 | growing |" in out
    assert "draft step ms at batch 2: slots " in out
    assert "target pass ms at batch 2 by window: 1 " in out
    assert "draft step check: graphed_vs_eager 0, " in out  # no CUDA here: the same eager pass twice


def test_the_draft_step_check_finds_steps_that_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = build("tiny-draft", torch.device("cpu"), torch.float32, 2)
    check = check_draft_steps(loaded, batch=3, prompt_len=10)
    assert check["slots_vs_growing"] < 1e-4 * check["logit_rms"] and check["argmax_agreement"] == 1.0
    forward = StepGraphs._forward

    def off_by_one_position(self, input_ids, slots, positions, length):  # a step that attends one position short
        return forward(self, input_ids, slots, positions - 1, length)

    monkeypatch.setattr(StepGraphs, "_forward", off_by_one_position)
    broken = check_draft_steps(loaded, batch=3, prompt_len=10)
    assert broken["slots_vs_growing"] > 10 * check["slots_vs_growing"] + 1e-3


def test_an_output_parting_from_target_only_is_checked_for_a_near_tie(workers: tuple) -> None:
    target, _ = workers
    prompts = [[(5 * i + j) % 200 for j in range(12)] for i in range(3)]
    references = target_only_continuations(target, prompts, 8)
    decoder = ReferenceDecoder(target.loaded)
    logits = decoder.logits(prompts[1], references[1][:3])
    runner_up = int(logits.topk(2).indices[1])  # float32: a clear second, no near-tie
    outputs = [references[0], references[1][:3] + [runner_up] + references[1][4:], references[2]]
    assert near_tie_partings(decoder, prompts, references, outputs) == {"divergences_checked": 1, "near_ties": 0}
    tie_decoder = ReferenceDecoder(target.loaded)
    gap = float(logits.max() - logits[runner_up])
    divergence = first_divergence(tie_decoder, prompts[1], references[1], outputs[1], tolerance=gap * 1.01)
    assert divergence is not None and divergence.near_tie and divergence.position == 3
