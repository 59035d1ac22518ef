"""Batched passes: many sequences with their own caches and lengths in one forward pass, and sessions
drafted and verified together, give what one-at-a-time gives (float32: identical up to reduction-order
noise; any token that differs must be a near-tie of the target's top two logits)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from draft_service.worker import DraftWorker
from specserve.bench.synthetic import lockstep
from specserve.core.types import SamplingParams
from specserve.models.loading import LoadedModel
from specserve.models.runner import ModelRunner
from specserve.models.sequence import CachedSequence
from specserve.worker.batching import BatchQueue
from specserve.worker.executor import ModelExecutor
from target_service.worker import TargetWorker, VerifyCall
from tests.helpers import assert_divergence_is_near_tie

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], list(range(10, 40)), [200, 201, 202, 203]]


def _prefilled(loaded: LoadedModel, prompt: list[int]) -> CachedSequence:
    sequence = CachedSequence(loaded.model, prompt)
    sequence.feed(1, upto=len(prompt) - 1)
    return sequence


def test_a_batched_pass_matches_one_pass_per_sequence(tiny_target: LoadedModel) -> None:
    alone = [_prefilled(tiny_target, p) for p in PROMPTS]
    together = [_prefilled(tiny_target, p) for p in PROMPTS]
    for round_new in ([[30, 31, 32], [40], [50, 51, 52, 53, 54], [7, 7]], [[1], [2], [3], [4]]):
        for a, b, new in zip(alone, together, round_new):
            a.truncate(len(a.token_ids) - 1)  # roll back one token, as a rejection does
            b.truncate(len(b.token_ids) - 1)
            a.token_ids.extend(new)
            b.token_ids.extend(new)
        expected = [s.feed(len(new)) for s, new in zip(alone, round_new)]
        batched = ModelRunner(tiny_target).feed(together, [len(new) for new in round_new])
        for e, got in zip(expected, batched):
            assert e.shape == got.shape
            torch.testing.assert_close(got, e, atol=1e-4, rtol=1e-4)
    for a, b in zip(alone, together):
        assert a.num_cached == b.num_cached
        for la, lb in zip(a.cache.layers, b.cache.layers):
            torch.testing.assert_close(lb.keys, la.keys, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [1, 4])
def test_sessions_drafted_and_verified_together_give_target_only_output(
    tiny_target: LoadedModel, tiny_draft: LoadedModel, engine, k: int
) -> None:
    from specserve.config import GenerationRequest

    # every session drafted and verified in shared passes, round by round, with the draft's own tokens
    outputs, _, _, _ = lockstep(TargetWorker(tiny_target), DraftWorker(tiny_draft), PROMPTS, k, 40, 0.0, None)
    for prompt, output in zip(PROMPTS, outputs):
        request = GenerationRequest(prompt_token_ids=tuple(prompt), max_tokens=40, num_speculative_tokens=0,
                                    ignore_eos=True)  # fmt: skip
        reference = engine.generate(request).token_ids
        assert len(output) == 40
        assert_divergence_is_near_tie(tiny_target, prompt, reference, output)


def test_a_bad_call_fails_alone(tiny_target: LoadedModel) -> None:
    from specserve.core.types import Proposal

    target = TargetWorker(tiny_target)
    target.prefill("good", [1, 2, 3])
    results = target.verify_batch([
        VerifyCall("good", Proposal([4, 5]), SamplingParams()),
        VerifyCall("missing", Proposal([4]), SamplingParams()),
        VerifyCall("good", Proposal([6]), SamplingParams()),  # the same session twice in one pass
    ])  # fmt: skip
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], KeyError) and isinstance(results[2], ValueError)


def test_calls_that_wait_during_a_pass_share_the_next_one() -> None:
    sizes: list[int] = []

    def run_batch(calls: list[tuple[str, int]]) -> list[int | Exception]:
        sizes.append(len(calls))
        import time

        time.sleep(0.05)
        return [ValueError("bad") if n < 0 else n * 10 for _, n in calls]

    async def scenario() -> list[object]:
        queue: BatchQueue[tuple[str, int], int] = BatchQueue(ModelExecutor("test"), run_batch, lambda c: c[0], 3)
        first = asyncio.ensure_future(queue.submit(("a", 1)))
        await asyncio.sleep(0.01)  # the model is now busy with the first call
        calls = [("b", 2), ("c", -1), ("a", 4), ("d", 5), ("e", 6)]
        rest = await asyncio.gather(*(queue.submit(c) for c in calls), return_exceptions=True)
        return [await first, *rest]

    results = asyncio.run(scenario())
    # the first call runs alone (an idle model waits for no one); the rest queue behind it, at most 3 per
    # pass and one call per session per pass
    assert sizes[0] == 1 and max(sizes) == 3 and sum(sizes) == 6
    assert [r[0] if isinstance(r, tuple) else type(r) for r in results] == [10, 20, ValueError, 40, 50, 60]
    assert len(results[0][2]) == 1 and {len(r[2]) for r in results[1:] if isinstance(r, tuple)} <= {2, 3}


def test_a_run_passes_again_on_the_model_thread_until_another_call_waits() -> None:
    passes: list[tuple[list[str], str]] = []  # each pass's sessions and the thread it ran on

    def run_batch(calls: list[tuple[str, int]]) -> list[int | Exception]:
        passes.append(([session for session, _ in calls], threading.current_thread().name))
        time.sleep(0.01)
        return [n for _, n in calls]

    async def scenario() -> tuple[list[int], object]:
        queue: BatchQueue[tuple[str, int], int] = BatchQueue(ModelExecutor("test"), run_batch, lambda c: c[0], 4)
        heard: list[int] = []

        def again(result: int, seconds: float, calls: list[tuple[str, int]]) -> bool:
            heard.append(result)
            return len(heard) < 8

        run = asyncio.ensure_future(queue.submit(("run", 7), again))
        await asyncio.sleep(0.035)  # a few of the run's passes
        other = await queue.submit(("other", 1))
        await run
        return heard, other

    heard, other = asyncio.run(scenario())
    assert heard == [7] * 8
    together = passes.index((["run", "other"], passes[0][1]))  # the run's next pass takes the other call in
    assert 2 <= together <= 5 and len(passes) == 8 and all(names == ["run"] for names, _ in passes[together + 1 :])
    assert {thread for _, thread in passes} == {passes[0][1]} and passes[0][1].startswith("test")


def test_greedy_rows_chosen_together_as_one_by_one(tiny_draft: LoadedModel) -> None:
    """The batched greedy choice of draft steps: DraftSession.step's token (the first of tied maxima, padding
    rows never) and its probability."""
    from draft_service.worker import DraftSession
    from specserve.models.runner import ModelRunner, greedy_choice

    vocab = tiny_draft.vocab_size
    rows = [torch.randn(vocab + 5) for _ in range(5)]
    rows[1][[3, 7]] = 50.0  # a tie: the first wins
    rows[2][vocab + 1] = 99.0  # a padding row never does
    choices = greedy_choice(rows, vocab)
    for row, (token_id, confidence) in zip(rows, choices):
        session = DraftSession(ModelRunner(tiny_draft), [1, 2], None)
        assert confidence == pytest.approx(session.step(row, SamplingParams()), rel=1e-5)
        assert session.sequence.token_ids[-1] == token_id
    assert choices[1][0] == 3 and choices[2][0] < vocab
