"""The draft's early stop: a window ends after a draft token the draft gave less than the threshold, alone
or in a batch with sessions that do not stop; served greedy output stays target-only's."""

from __future__ import annotations

import torch

from draft_service.worker import DraftWorker, ProposeCall
from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from specserve.core.types import SamplingParams
from specserve.models.loading import LoadedModel
from specserve_client import SpecServeClient
from tests.stack import LocalStack

GREEDY = SamplingParams()
PROMPT_IDS = [3, 17, 42, 9, 11]


def _draft_probs(tiny_draft: LoadedModel, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.softmax(tiny_draft.model(input_ids=torch.tensor([token_ids])).logits[0].float(), dim=-1)


def test_a_window_ends_after_the_first_unconfident_draft(tiny_draft: LoadedModel) -> None:
    worker = DraftWorker(tiny_draft)
    full = {}
    for threshold in (0.0, 1.0):
        worker.prefill(f"s{threshold}", PROMPT_IDS)
        full[threshold] = worker.propose_batch([ProposeCall(f"s{threshold}", 5, [], 6, GREEDY, threshold)])[0]
    assert len(full[0.0].token_ids) == 6 and len(full[1.0].token_ids) == 1
    # the probability the draft gave each of its greedy drafts, and a threshold between two of them
    probs = _draft_probs(tiny_draft, PROMPT_IDS + full[0.0].token_ids)[len(PROMPT_IDS) - 1 : -1]  # [6, vocab]
    confidences = [float(row[t]) for row, t in zip(probs, full[0.0].token_ids)]
    threshold = sorted(confidences)[2]
    expected = next(i + 1 for i, c in enumerate(confidences) if c < threshold)
    worker.prefill("mid", PROMPT_IDS)
    worker.prefill("none", PROMPT_IDS)
    mixed = worker.propose_batch(
        [ProposeCall("mid", 5, [], 6, GREEDY, threshold), ProposeCall("none", 5, [], 6, GREEDY, 0.0)]
    )
    assert mixed[0].token_ids == full[0.0].token_ids[:expected]  # batched with a session that drafts on
    assert mixed[1].token_ids == full[0.0].token_ids


def test_served_greedy_output_with_early_stop_equals_target_only(engine: SpeculativeEngine) -> None:
    prompts = ["def add(a, b):", "class Tree:", "import os\n"]
    overrides = {"draft_confidence_threshold": 0.05}
    with LocalStack(orchestrator=overrides) as stack, SpecServeClient(stack.address) as client:
        proposed = rounds = 0
        for prompt in prompts:
            response = client.generate(prompt, max_tokens=40, num_speculative_tokens=4, ignore_eos=True)
            reference = engine.generate(
                GenerationRequest(prompt=prompt, max_tokens=40, num_speculative_tokens=0, ignore_eos=True)
            )
            assert list(response.token_ids) == reference.token_ids
            proposed, rounds = proposed + response.stats.proposed, rounds + response.stats.rounds
    assert rounds < proposed < 4 * rounds  # windows were cut short, and not all to one draft
