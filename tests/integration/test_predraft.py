"""Pre-drafting served: kept while windows are accepted whole, dropped for a session whose windows seldom are
(each pre-draft costs a call; orchestrator/predraft.py). Output is the target's either way."""

from __future__ import annotations

import pytest

from specserve_client import SpecServeClient
from tests.integration.test_adaptive_served import Recorder
from tests.stack import LocalStack


def _predrafts(draft: str) -> tuple[int, int]:
    """(pre-draft calls, rounds) of one greedy request at k = 8 (a pre-draft sends no new tokens)."""
    recorder = Recorder(methods=("Propose",))
    with LocalStack(draft=draft, interceptors={"draft": [recorder]}) as stack, SpecServeClient(stack.address) as client:
        stats = client.generate("def add(a, b):", max_tokens=96, num_speculative_tokens=8, ignore_eos=True).stats
    return sum(1 for _, call, _ in recorder.calls if not call.new_token_ids), stats.rounds


@pytest.mark.parametrize(("draft", "whole"), [("tiny", True), ("tiny-draft", False)])
def test_pre_drafts_follow_how_often_windows_are_accepted_whole(draft: str, whole: bool) -> None:
    predrafts, rounds = _predrafts(draft)
    if whole:  # the draft is the target: every guess holds, every round pre-drafts the next
        assert predrafts >= rounds - 2, (predrafts, rounds)
    else:  # a perturbed one-layer draft: windows of 8 seldom held whole
        assert predrafts < rounds / 3, (predrafts, rounds)  # pre-drafting every round: about `rounds`
