"""Wire conversions: sparse draft distributions survive the round trip exactly; bad ones are refused."""

from __future__ import annotations

import pytest
import torch

from protos import convert
from specserve.config import GenerationRequest
from specserve.core.stats import SpeculationStats
from specserve.core.types import SamplingParams
from specserve.core.verify import DRAFT_SUPPORT_MASS, truncate_support


def test_truncate_support_keeps_the_mass_and_renormalises() -> None:
    probs = torch.softmax(torch.randn(3, 1000, generator=torch.Generator().manual_seed(0)) * 4, dim=-1)
    cut = truncate_support(probs)
    assert torch.allclose(cut.sum(-1), torch.ones(3))
    for row, original in zip(cut, probs):
        kept = row > 0
        assert original[kept].sum() >= DRAFT_SUPPORT_MASS - 1e-6
        assert kept.sum() < 1000  # something was cut
        assert original[kept].min() >= original[~kept].max()  # the top tokens are the ones kept


def test_sparse_probs_round_trip_exactly() -> None:
    probs = truncate_support(torch.softmax(torch.randn(4, 300) * 3, dim=-1))
    message = convert.probs_to_proto(probs)
    assert len(message.token_ids) < 4 * 300
    assert torch.equal(convert.probs_from_proto(message, 300), probs)


@pytest.mark.parametrize(
    ("lengths", "ids", "values", "match"),
    [
        ([2], [1], [0.5], "do not line up"),
        ([1], [300], [1.0], "token ids"),
        ([1], [-1], [1.0], "token ids"),
        ([1], [3], [float("nan")], "finite"),
        ([1], [3], [-1.0], ">= 0"),
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
    assert convert.generation_request_from_proto(convert.generation_request_to_proto(request)) == request
    chat = GenerationRequest(messages=(("user", "hi"),))
    back = convert.generation_request_from_proto(convert.generation_request_to_proto(chat))
    assert back.messages == chat.messages and back.num_speculative_tokens is None and back.sampling.seed is None


def test_stats_carry_every_public_figure() -> None:
    stats = SpeculationStats(num_proposed=8, num_accepted=6, num_rounds=2, total_s=1.0, num_generated=8)
    message = convert.stats_to_proto(stats)
    assert (message.proposed, message.accepted, message.rounds) == (8, 6, 2)
    assert message.acceptance_rate == pytest.approx(0.75) and message.mean_acceptance_length == pytest.approx(4.0)
