"""ModelExecutor: one call at a time on the model thread, passes and prompt chunks taking turns; short
passes on the loop's thread."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import torch

from specserve.worker.executor import ModelExecutor


def _scenario(queued: list[tuple[str, bool]]) -> list[str]:
    """Holds the model with a first pass while `queued` calls (name, background) arrive in order; the order
    they ran in."""
    ran: list[str] = []
    release = threading.Event()

    async def scenario() -> None:
        executor = ModelExecutor("test")
        first = asyncio.ensure_future(executor.run(lambda: (release.wait(5), ran.append("first"))))
        await asyncio.sleep(0.02)  # the model is busy with the first call
        calls = [asyncio.ensure_future(executor.run(ran.append, name, background=bg)) for name, bg in queued]
        await asyncio.sleep(0.02)  # all queued
        release.set()
        await asyncio.gather(first, *calls)
        executor.shutdown()

    asyncio.run(scenario())
    return ran


def test_a_burst_of_prompt_chunks_does_not_hold_the_passes_behind_it() -> None:
    # first come first served would run the five chunks before the pass: at 16 clients here a session's
    # Verify waited 30 s behind the prefills of the new requests and hit its deadline
    queued = [(f"chunk{i}", True) for i in range(5)] + [("pass1", False), ("pass2", False)]
    assert _scenario(queued) == ["first", "chunk0", "pass1", "chunk1", "pass2", "chunk2", "chunk3", "chunk4"]


def test_passes_do_not_starve_prompt_chunks() -> None:
    queued = [("pass1", False), ("pass2", False), ("pass3", False), ("chunk", True)]
    assert _scenario(queued) == ["first", "chunk", "pass1", "pass2", "pass3"]


def test_one_class_alone_runs_first_come_first_served() -> None:
    queued = [(f"pass{i}", False) for i in range(4)]
    assert _scenario(queued) == ["first", "pass0", "pass1", "pass2", "pass3"]


def test_a_caller_cancelled_while_waiting_loses_its_turn_and_blocks_no_one() -> None:
    ran: list[str] = []
    release = threading.Event()

    async def scenario() -> None:
        executor = ModelExecutor("test")
        first = asyncio.ensure_future(executor.run(lambda: (release.wait(5), ran.append("first"))))
        await asyncio.sleep(0.02)
        gone = asyncio.ensure_future(executor.run(ran.append, "gone", background=True))
        kept = asyncio.ensure_future(executor.run(ran.append, "kept"))
        await asyncio.sleep(0.02)
        gone.cancel()
        release.set()
        await first
        await kept
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert await executor.run(lambda: "later") == "later"  # the model was handed back
        executor.shutdown()

    asyncio.run(scenario())
    assert ran == ["first", "kept"]


def test_a_caller_cancelled_while_its_call_runs_holds_the_model_until_the_call_returns() -> None:
    ran: list[str] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)
        ran.append("slow")

    async def scenario() -> None:
        executor = ModelExecutor("test")
        running = asyncio.ensure_future(executor.run(slow))
        await asyncio.to_thread(started.wait, 5)
        running.cancel()
        after = asyncio.ensure_future(executor.run(ran.append, "after"))
        await asyncio.sleep(0.02)
        assert ran == []  # "after" waits for the model, not for the cancelled caller
        release.set()
        await after
        executor.shutdown()

    asyncio.run(scenario())
    assert ran == ["slow", "after"]


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_openmp_team_of_an_idle_model_thread_goes_away_and_forms_again() -> None:
    # at libgomp's default spin a team kept a core busy ~8 ms after each pass, the cores a draft and a
    # target on one machine hand each other
    data = torch.arange(4_000_000, dtype=torch.float32)

    def parallel_pass() -> tuple[set[str], float]:
        torch.set_num_threads(2)
        total = float(data.sum())  # one parallel region: the model thread's team of two
        return _threads(), total

    async def scenario() -> None:
        executor = ModelExecutor("test")
        during, first = await executor.run(parallel_pass)
        settled = _threads_after_settling(during)
        assert during - settled, "the team's thread outlived the pass on an idle model thread"
        during_again, again = await executor.run(parallel_pass)
        assert during_again - settled, "the next pass ran without a team"
        assert again == first
        executor.shutdown()

    previous = torch.get_num_threads()
    try:
        asyncio.run(scenario())
    finally:
        torch.set_num_threads(previous)


def _threads_after_settling(during: set[str], timeout_s: float = 2.0) -> set[str]:
    """The threads once those of `during` that are leaving have left (or after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while (now := _threads()) >= during and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


@pytest.mark.parametrize(("first_pass_s", "inline"), [(0.0, True), (0.03, False)])
def test_a_pass_runs_on_the_loops_thread_only_after_a_short_one(first_pass_s: float, inline: bool) -> None:
    threads: list[threading.Thread] = []

    async def scenario() -> None:
        executor = ModelExecutor("test")
        executor.inline_below_s = 0.01
        await executor.timed(lambda: (time.sleep(first_pass_s), threads.append(threading.current_thread())))
        await executor.timed(lambda: threads.append(threading.current_thread()))
        threads.append(threading.current_thread())  # the loop's
        executor.shutdown()

    asyncio.run(scenario())
    first, second, loop = threads
    assert first is not loop  # nothing measured yet: the model thread
    assert (second is loop) is inline
