"""The synthetic benchmark on the CPU with small shapes: the controlled draft hits the acceptance it is
told to, and outputs stay identical to target-only (verification is the real one)."""

from __future__ import annotations

import pytest
import torch

from draft_service.worker import DraftWorker
from specserve.bench.synthetic import Point, build, lockstep, main, measure, target_only_continuations
from target_service.worker import TargetWorker


@pytest.fixture(scope="module")
def workers() -> tuple[TargetWorker, DraftWorker]:
    cpu = torch.device("cpu")
    return TargetWorker(build("tiny", cpu, torch.float32, seed=1)), DraftWorker(
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


def test_measure_and_the_command(workers: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    target, draft = workers
    rows = measure(target, draft, [Point(0.9, 2, 1), Point(0.9, 2, 3)], prompt_len=8, max_tokens=16)
    assert [(r["concurrency"], r["k"]) for r in rows] == [(1, 0), (1, 2), (3, 0), (3, 2)]
    assert all(r["identical_to_target_only"] == r["concurrency"] for r in rows if r["k"])
    args = ["--target", "tiny", "--draft", "tiny-draft", "--device", "cpu", "--dtype", "float32", "--alphas", "0.8",
            "--ks", "2", "--concurrency", "2", "--prompt-len", "8", "--max-tokens", "8"]  # fmt: skip
    assert main(args) == 0
    assert "| 2 | 0.80 | 2 |" in capsys.readouterr().out
