"""When a session pre-drafts (orchestrator/predraft.py): while the expected saving beats a call's host time."""

from __future__ import annotations

from orchestrator.predraft import PredraftOdds


def test_it_pre_drafts_until_a_propose_call_was_measured() -> None:
    odds = PredraftOdds()
    for _ in range(50):
        odds.observe_window(num_drafted=4, num_accepted=0)
    assert odds.pays()


def test_windows_seldom_accepted_whole_stop_it_and_whole_ones_bring_it_back() -> None:
    odds = PredraftOdds()
    odds.observe_propose(seconds=0.003, compute_s=0.002)  # 1 ms of host time for a 3 ms call
    for _ in range(20):
        odds.observe_window(num_drafted=4, num_accepted=1)
    assert not odds.pays()
    for _ in range(10):
        odds.observe_window(num_drafted=4, num_accepted=4)
    assert odds.pays()


def test_a_slow_draft_pays_for_pre_drafts_at_low_odds() -> None:
    """A 50 ms propose (a real draft on the CPU) repays a 1 ms call at one whole window in twenty."""
    odds = PredraftOdds(whole_rate=0.05)
    odds.observe_propose(seconds=0.050, compute_s=0.049)
    assert odds.pays()
    odds.observe_window(num_drafted=4, num_accepted=0)
    assert odds.pays() is (odds.whole_rate * 0.050 > 0.001)
