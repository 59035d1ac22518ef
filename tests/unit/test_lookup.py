"""The prompt-lookup proposer: longest and most recent match, n-gram bounds, rollback, no match."""

from __future__ import annotations

import random

import pytest
import torch

from draft_service.lookup import LookupConfig, LookupSession, LookupWorker, NgramIndex
from draft_service.worker import ProposeCall
from specserve.core.types import SamplingParams
from specserve.core.verify import rejection_sample
from specserve.models.draft_names import parse_draft_name
from specserve.worker.sessions import SessionNotFoundError

GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=1.0)


def test_the_longest_suffix_match_wins_over_a_more_recent_shorter_one() -> None:
    #            [1 2 3] 4 ... [3] 7 ... then the context ends in 1 2 3
    index = NgramIndex(LookupConfig(max_ngram=3, min_ngram=1), [1, 2, 3, 4, 5, 9, 3, 7, 8, 1, 2, 3])
    assert index.match(3) == (3, [4, 5, 9])


def test_of_equal_matches_the_most_recent_one_wins() -> None:
    index = NgramIndex(LookupConfig(max_ngram=2, min_ngram=1), [5, 6, 1, 5, 6, 2, 5, 6])
    assert index.match(2) == (2, [2, 5])


def test_the_continuation_stops_at_the_end_of_the_context() -> None:
    index = NgramIndex(LookupConfig(max_ngram=2, min_ngram=2), [1, 2, 3, 1, 2])
    assert index.match(8) == (2, [3, 1, 2])


def test_max_ngram_bounds_the_match_and_min_ngram_refuses_short_ones() -> None:
    tokens = [1, 2, 3, 4, 0, 9, 3, 5, 0, 1, 2, 3]
    assert NgramIndex(LookupConfig(max_ngram=3, min_ngram=1), tokens).match(1) == (3, [4])
    assert NgramIndex(LookupConfig(max_ngram=1, min_ngram=1), tokens).match(1) == (1, [5])  # latest "3"
    assert NgramIndex(LookupConfig(max_ngram=4, min_ngram=4), tokens).match(1) == (0, [])


def test_no_match_proposes_nothing() -> None:
    session = LookupSession([1, 2, 3, 4], LookupConfig(min_ngram=1))
    for sampling in (GREEDY, SAMPLED):
        proposal = session.propose(4, sampling)
        assert proposal.token_ids == [] and proposal.probs is None and proposal.source == "ngram"
    assert session.index.token_ids == [1, 2, 3, 4]


def test_a_proposal_joins_the_context_and_commit_rolls_it_back() -> None:
    session = LookupSession([7, 8, 9, 7, 8], LookupConfig(min_ngram=2))
    assert session.propose(2, GREEDY).token_ids == [9, 7]
    assert session.index.token_ids == [7, 8, 9, 7, 8, 9, 7]  # as a model draft's context holds its proposal
    session.commit(6, [4])  # the target took 9 and rejected 7 for 4
    assert session.index.token_ids == [7, 8, 9, 7, 8, 9, 4]
    assert session.propose(3, GREEDY).token_ids == []  # "9 4" never occurred
    session.commit(7, [7, 8])
    assert session.propose(3, GREEDY).token_ids == [9, 4, 7]  # the latest "7 8" was followed by 9 4


def test_rollback_leaves_the_index_as_if_the_tokens_never_came() -> None:
    rng = random.Random(0)
    config = LookupConfig(max_ngram=4, min_ngram=1)
    tokens = [rng.randrange(5) for _ in range(200)]
    index = NgramIndex(config, tokens[:150])
    for _ in range(50):  # random keep-N then append, against an index built afresh
        keep = rng.randrange(1, len(index) + 1)
        index.truncate(keep)
        index.extend(tokens[keep : keep + rng.randrange(1, 10)])
        fresh = NgramIndex(config, index.token_ids)
        assert index._latest == fresh._latest and index.match(6) == fresh.match(6)
    assert index.token_ids == tokens[: len(index)]


def test_a_sampled_proposal_is_one_hot_and_the_rejection_rule_keeps_the_target_distribution() -> None:
    session = LookupSession([3, 1, 2, 3, 1], LookupConfig(min_ngram=2))
    proposal = session.propose(2, SAMPLED)
    assert proposal.token_ids == [2, 3] and proposal.probs is not None
    assert [p.tolist() for p in proposal.probs.probs] == [[1.0], [1.0]]
    target_probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 3)  # [k + 1, vocab]
    counts = torch.zeros(4)
    generator = torch.Generator().manual_seed(0)
    draft_probs = proposal.probs.to_dense(4)
    for _ in range(4000):
        verdict = rejection_sample(proposal.token_ids, draft_probs, target_probs, generator)
        counts[verdict.token_ids[0]] += 1  # the first output token must follow the target's row 0
    assert torch.allclose(counts / counts.sum(), target_probs[0], atol=0.03)


def test_parse_draft_name() -> None:
    assert parse_draft_name("ngram") == (None, True)
    assert parse_draft_name("tiny-draft+ngram") == ("tiny-draft", True)
    assert parse_draft_name("tiny-draft") == ("tiny-draft", False)
    with pytest.raises(ValueError, match="MODEL\\+ngram"):
        parse_draft_name("+ngram")


def test_config_refuses_bad_bounds() -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        LookupConfig(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="min_ngram"):
        LookupConfig(min_ngram=0)


def test_worker_sessions_and_errors() -> None:
    worker = LookupWorker()
    worker.prefill("s", [1, 2, 3, 1, 2])
    results = worker.propose_batch([
        ProposeCall("s", 5, [], 2, GREEDY),
        ProposeCall("nope", 0, [], 2, GREEDY),
    ])  # fmt: skip
    assert results[0].token_ids == [3, 1]  # type: ignore[union-attr]
    assert isinstance(results[1], SessionNotFoundError)
    with pytest.raises(ValueError, match="num_kept"):
        worker.propose("s", 99, [], 2, GREEDY)
    with pytest.raises(ValueError, match=">= 0"):
        worker.propose("s", 7, [-1], 2, GREEDY)
    assert worker.release("s") and not worker.release("s")
