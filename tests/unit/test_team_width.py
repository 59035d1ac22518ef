"""TeamWidth: a draft takes every core for a batch only while that is measured faster."""

from __future__ import annotations

from specserve.worker.threads import MIN_EXPLORE_EVERY, TeamWidth


def _run(width: TeamWidth, seconds: dict[int, float], num_batches: int, batch_size: int = 1) -> list[int]:
    """The widths chosen for `num_batches` batches whose step takes seconds[width]."""
    chosen = []
    for _ in range(num_batches):
        threads = width.choose(batch_size)
        width.observe(batch_size, threads, 3 * seconds[threads], num_steps=3)
        chosen.append(threads)
    return chosen


def test_every_core_is_tried_first_then_the_faster_width_is_kept() -> None:
    width = TeamWidth(own=1, every=2)
    chosen = _run(width, {1: 0.001, 2: 0.008}, 2 + 4 * MIN_EXPLORE_EVERY)  # busy cores: two threads are slower
    assert chosen[:2] == [2, 1]
    assert chosen[2:].count(2) <= 3  # tried again now and then, less often each time it loses
    chosen = _run(TeamWidth(own=1, every=2), {1: 0.008, 2: 0.001}, 2 + 4 * MIN_EXPLORE_EVERY)  # free cores
    assert chosen[2:].count(1) <= 3


def test_a_change_of_load_is_noticed_and_batch_sizes_are_measured_apart() -> None:
    width = TeamWidth(own=1, every=2)
    _run(width, {1: 0.001, 2: 0.008}, 100)
    assert _run(width, {1: 0.008, 2: 0.001}, 3 * 512)[-100:] == [2] * 100  # the cores came free
    assert _run(width, {1: 0.001, 2: 0.008}, 2, batch_size=16) == [2, 1]  # a bucket of its own


def test_nothing_to_choose_without_more_cores() -> None:
    assert _run(TeamWidth(own=2, every=2), {2: 0.001}, 5) == [2] * 5
