"""Turns: draft and verify calls of a replica's sessions alternate, never overlap, and sessions that start
out of step end up in one group, so that each pass batches them all; a cancelled call leaks nothing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from orchestrator.turns import Phase, Turns


def _run_rounds(num_sessions: int, num_rounds: int, seed: int) -> tuple[list[tuple[Phase, int]], int]:
    """Sessions that draft, then verify, `num_rounds` times, starting at random moments and pausing a
    random little while between calls (the orchestrator's own work): each turn's (phase, sessions) in
    order, and the most calls of both phases ever in flight at once."""
    rng = random.Random(seed)
    turns, in_flight = Turns(), Counter[Phase]()
    log: list[tuple[Phase, set[str]]] = []
    most_mixed = 0

    async def call(phase: Phase, session_id: str, seconds: float) -> None:
        nonlocal most_mixed
        async with turns.take(phase, session_id):
            in_flight[phase] += 1
            most_mixed = max(most_mixed, min(in_flight[Phase.DRAFT], in_flight[Phase.VERIFY]))
            if not log or log[-1][0] is not phase or session_id in log[-1][1]:
                log.append((phase, set()))
            log[-1][1].add(session_id)
            await asyncio.sleep(seconds)
            in_flight[phase] -= 1

    async def session(session_id: str) -> None:
        await asyncio.sleep(rng.uniform(0, 0.03))
        for _ in range(num_rounds):
            await call(Phase.DRAFT, session_id, rng.uniform(0.004, 0.006))
            await asyncio.sleep(rng.uniform(0, 0.002))
            await call(Phase.VERIFY, session_id, rng.uniform(0.008, 0.010))
            await asyncio.sleep(rng.uniform(0, 0.002))

    async def scenario() -> None:
        await asyncio.gather(*(session(f"s{i}") for i in range(num_sessions)))
        assert turns.num_in_flight == 0

    asyncio.run(scenario())
    return [(phase, len(members)) for phase, members in log], most_mixed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_phases_never_overlap_and_sessions_fall_into_step(seed: int) -> None:
    log, most_mixed = _run_rounds(num_sessions=6, num_rounds=20, seed=seed)
    assert most_mixed == 0  # never a draft call beside a verify call
    assert all(a[0] is not b[0] for a, b in zip(log, log[1:]))  # the phases alternate
    assert sum(n for phase, n in log if phase is Phase.DRAFT) == 6 * 20  # every call ran
    # the sessions start apart and fall into step within a few turns; those that began a round ahead
    # also end one ahead (at most four turns at either end)
    assert log[4:-4] == [(Phase.DRAFT, 6), (Phase.VERIFY, 6)] * ((len(log) - 8) // 2)
    assert len(log) >= 2 * 20


def test_a_lone_session_never_waits() -> None:
    """Every call of a lone session enters without suspending: nothing in between to wait for."""

    async def scenario() -> None:
        turns = Turns()
        for phase in [Phase.DRAFT, Phase.VERIFY, Phase.VERIFY] * 3:  # the last: a round without drafts
            entering = turns.take(phase, "s")
            with pytest.raises(StopIteration):
                entering.__aenter__().send(None)  # done at the first step: it never awaited
            assert (turns.phase, turns.num_in_flight) == (phase, 1)
            await entering.__aexit__(None, None, None)
            assert turns.num_in_flight == 0

    asyncio.run(scenario())


def test_a_late_session_waits_for_the_next_turn_of_its_phase() -> None:
    """Joining a turn already under way would put it in a pass of its own behind the others' pass. It
    drafts after them, and the verify turn then takes both."""

    async def scenario() -> list[tuple[str, str, int]]:
        turns, order = Turns(), []
        first_in = asyncio.Event()

        async def session(session_id: str) -> None:
            if session_id == "late":
                await first_in.wait()
            for phase in (Phase.DRAFT, Phase.VERIFY):
                async with turns.take(phase, session_id):
                    first_in.set()
                    await asyncio.sleep(0.01)
                    order.append((session_id, phase.value, turns.num_in_flight))
                    await asyncio.sleep(0.01)

        await asyncio.gather(session("early"), session("late"))
        return order

    order = asyncio.run(scenario())
    assert order[:2] == [("early", "draft", 1), ("late", "draft", 1)]
    assert sorted(order[2:]) == [("early", "verify", 2), ("late", "verify", 2)]


def test_a_cancelled_call_gives_its_turn_back() -> None:
    async def scenario() -> None:
        turns = Turns()
        holder_in, release = asyncio.Event(), asyncio.Event()

        async def waiter(session_id: str) -> None:
            async with turns.take(Phase.DRAFT, session_id):
                await asyncio.sleep(0)

        held = asyncio.ensure_future(_hold(turns, Phase.VERIFY, "a", holder_in, release))
        await holder_in.wait()
        gone, stays = asyncio.ensure_future(waiter("b")), asyncio.ensure_future(waiter("c"))
        await asyncio.sleep(0.01)
        gone.cancel()  # cancelled while waiting for its turn
        release.set()
        await asyncio.wait_for(asyncio.gather(held, stays), 1)
        assert gone.cancelled() and turns.num_in_flight == 0

        # cancelled after it was let in, before it ran: it leaves as if it had run
        admitted = asyncio.ensure_future(waiter("b"))
        async with turns.take(Phase.VERIFY, "a"):
            await asyncio.sleep(0.01)  # b waits for the draft turn
        admitted.cancel()  # the verify turn just ended and let b in; b has not run yet
        await asyncio.gather(admitted, return_exceptions=True)
        assert admitted.cancelled() and turns.num_in_flight == 0
        await asyncio.wait_for(waiter("c"), 1)

    asyncio.run(scenario())


def test_a_round_without_drafts_joins_a_verify_turn_unless_a_session_waits_to_draft() -> None:
    """Sessions all at k = 0 batch as target-only ones do; one waiting to draft is not held up by them."""

    async def scenario() -> None:
        turns = Turns()
        holder_in, release = asyncio.Event(), asyncio.Event()

        held = asyncio.ensure_future(_hold(turns, Phase.VERIFY, "a", holder_in, release))
        await holder_in.wait()
        joining = turns.take(Phase.VERIFY, "b", late_ok=True)
        with pytest.raises(StopIteration):
            joining.__aenter__().send(None)  # in at once, beside a's verification
        assert turns.num_in_flight == 2
        await joining.__aexit__(None, None, None)

        drafter = asyncio.ensure_future(_one_call(turns, Phase.DRAFT, "c"))
        late = asyncio.ensure_future(_one_call(turns, Phase.VERIFY, "d", late_ok=True))
        await asyncio.sleep(0.01)
        assert not drafter.done() and not late.done()  # d waits: c is waiting to draft
        release.set()
        await asyncio.wait_for(asyncio.gather(held, drafter, late), 1)
        assert turns.num_in_flight == 0

    asyncio.run(scenario())


async def _one_call(turns: Turns, phase: Phase, session_id: str, late_ok: bool = False) -> None:
    async with turns.take(phase, session_id, late_ok):
        await asyncio.sleep(0.001)


async def _hold(turns: Turns, phase: Phase, session_id: str, entered: asyncio.Event, release: asyncio.Event) -> None:
    """A call of `phase` that stays in flight until `release` is set."""
    async with turns.take(phase, session_id):
        entered.set()
        await release.wait()
