"""Wire conversions: sparse draft distributions survive the round trip exactly; bad ones are refused."""

from __future__ import annotations

import pytest
import torch

from orchestrator import generation
from specserve.config import GenerationRequest
from specserve.core.stats import SpeculationStats
from specserve.core.types import SamplingParams, SparseProbs
from specserve.core.verify import DRAFT_SUPPORT_MASS, top_support
from specserve.worker import convert


def _distributions() -> torch.Tensor:
    """[4, 5000]: peaked rows, whose support is a few tokens, and flat ones that need most of the vocabulary."""
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(0))
    return torch.softmax(logits * torch.tensor([[8.0], [4.0], [0.5], [0.0]]), dim=-1)


def test_top_support_is_the_smallest_top_set_holding_the_mass() -> None:
    for original in _distributions():
        token_ids, probs = top_support(original)
        assert probs.sum() == pytest.approx(1.0) and len(set(token_ids.tolist())) == len(token_ids)
        kept = torch.zeros(5000, dtype=torch.bool)
        kept[token_ids] = True
        assert original[kept].sum() >= DRAFT_SUPPORT_MASS - 1e-6
        assert original[token_ids[:-1]].sum() < DRAFT_SUPPORT_MASS + 1e-6  # one token fewer would not do
        if not kept.all():  # the flat row needs every token
            assert original[kept].min() >= original[~kept].max()  # the top tokens are the ones kept
        assert torch.allclose(probs, original[token_ids] / original[kept].sum())
    sizes = [len(top_support(row)[0]) for row in _distributions()]
    assert sizes[0] < 64 < sizes[2] < sizes[3] == 5000  # a partial top-k widened as far as needed


def test_sparse_probs_round_trip_exactly() -> None:
    rows = [top_support(row) for row in _distributions()[:2]]
    probs = SparseProbs(tuple(ids for ids, _ in rows), tuple(p for _, p in rows))
    message = convert.probs_to_proto(probs)
    assert list(message.row_lengths) == [len(ids) for ids, _ in rows] and len(message.token_ids) < 2 * 5000
    back = convert.probs_from_proto(message, 5000)
    assert torch.equal(back.to_dense(5000), probs.to_dense(5000))
    dense = probs.to_dense(5000)
    assert torch.allclose(dense.sum(-1), torch.ones(2)) and (dense[1] > 0).sum() == len(rows[1][0])
    assert torch.equal(probs[1:].to_dense(5000), dense[1:])


@pytest.mark.parametrize(
    ("lengths", "ids", "values", "match"),
    [
        ([2], [1], [0.5], "do not line up"),
        ([1], [300], [1.0], "token ids"),
        ([1], [-1], [1.0], "token ids"),
        ([1], [3], [float("nan")], "finite"),
        ([2], [3, 4], [0.5, float("nan")], "finite"),
        ([2], [3, 4], [0.5, float("inf")], "finite"),
        ([1], [3], [float("-inf")], "finite"),
        ([1], [3], [-1.0], ">= 0"),
        ([-1, 2], [3], [1.0], "row_lengths must be >= 0"),
    ],
)
def test_malformed_sparse_probs_are_refused(
    lengths: list[int], ids: list[int], values: list[float], match: str
) -> None:
    from protos import specserve_pb2 as pb

    with pytest.raises(ValueError, match=match):
        convert.probs_from_proto(pb.SparseProbs(row_lengths=lengths, token_ids=ids, probs=values), 300)


def test_generation_request_round_trip() -> None:
    request = GenerationRequest(
        prompt="hi",
        max_tokens=7,
        sampling=SamplingParams(0.5, 0.9, 3, 11),
        stop=("x",),
        num_speculative_tokens=2,
        ignore_eos=True,
    )
    assert generation.generation_request_from_proto(generation.generation_request_to_proto(request)) == request
    chat = GenerationRequest(messages=(("user", "hi"),))
    back = generation.generation_request_from_proto(generation.generation_request_to_proto(chat))
    assert back.messages == chat.messages and back.num_speculative_tokens is None and back.sampling.seed is None


def test_stats_carry_every_public_figure() -> None:
    stats = SpeculationStats(num_proposed=8, num_accepted=6, num_rounds=2, total_s=1.0, num_generated=8)
    message = generation.stats_to_proto(stats)
    assert (message.proposed, message.accepted, message.rounds) == (8, 6, 2)
    assert message.acceptance_rate == pytest.approx(0.75) and message.mean_acceptance_length == pytest.approx(4.0)


def test_placement_round_trips_and_an_older_worker_reports_none() -> None:
    from protos import specserve_pb2 as pb
    from specserve.placement import Placement

    placement = Placement("boot-a", "cpu", frozenset({0, 3}))
    message = pb.ModelInfoResponse(model="m")
    assert convert.placement_from_proto(message) is None  # a worker from before placements were reported
    message.placement.CopyFrom(pb.Placement(host="boot-a", device="cpu", cpus=[3, 0]))
    assert convert.placement_from_proto(message) == placement
