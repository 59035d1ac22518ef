"""Whether a model thread's wider OpenMP team pays now: a draft whose target waits for it may run on every
core, which is faster only while those cores are free. On a busy machine a team as wide as the cores waits
for its descheduled member at every parallel region, and small operations slow down by orders of magnitude
(docs/architecture.md, "Model execution: OpenMP")."""

from __future__ import annotations

from dataclasses import dataclass

EWMA_WEIGHT = 0.2  # of the newest batch in a width's estimate
MIN_EXPLORE_EVERY = 8  # eligible batches of a bucket between tries of the losing width, at first
MAX_EXPLORE_EVERY = 512  # and at most, the interval doubling each time the loser loses again


@dataclass(slots=True)
class _Bucket:
    seconds: dict[int, float]  # width -> EWMA of seconds per step (one token for every row)
    explore_every: int = MIN_EXPLORE_EVERY
    since_explore: int = 0
    exploring: int | None = None  # the width being tried, while its batch runs


class TeamWidth:
    """Chooses between the thread's own team (`own` threads) and every core (`every`) for batches that may
    widen, by the model thread's measured seconds per step at each width, per batch size (a power-of-two
    bucket): the faster one, and the slower one again now and then, less often each time it loses, in
    case the machine's load has changed. Not thread-safe: the model thread's alone."""

    def __init__(self, own: int, every: int) -> None:
        self.own, self.every = own, every
        self._buckets: dict[int, _Bucket] = {}

    def choose(self, batch_size: int) -> int:
        """The width for a batch of `batch_size` calls that may run on every core."""
        if self.every <= self.own:
            return self.own
        bucket = self._buckets.setdefault(_bucket_of(batch_size), _Bucket({}))
        for width in (self.every, self.own):  # each width measured once first, the wider one (the default) first
            if width not in bucket.seconds:
                bucket.exploring = width
                return width
        best = min((self.every, self.own), key=bucket.seconds.__getitem__)
        bucket.since_explore += 1
        if bucket.since_explore >= bucket.explore_every:
            bucket.since_explore, bucket.exploring = 0, self.own if best == self.every else self.every
            return bucket.exploring
        return best

    def observe(self, batch_size: int, width: int, seconds: float, num_steps: int) -> None:
        """A batch of `batch_size` calls ran `num_steps` steps at `width` threads in `seconds` (model thread)."""
        bucket = self._buckets.get(_bucket_of(batch_size))
        if bucket is None or num_steps < 1 or width not in (self.own, self.every):
            return
        per_step, before = seconds / num_steps, bucket.seconds.get(width)
        if before is None or bucket.exploring == width:  # a try: what this width costs now, as it is
            bucket.seconds[width] = per_step
        else:
            bucket.seconds[width] = before + EWMA_WEIGHT * (per_step - before)
        if bucket.exploring == width and before is not None:  # a try of the loser: did it win now?
            other = self.own if width == self.every else self.every
            lost = bucket.seconds[width] >= bucket.seconds[other]
            bucket.explore_every = min(MAX_EXPLORE_EVERY, 2 * bucket.explore_every) if lost else MIN_EXPLORE_EVERY
        bucket.exploring = None


def _bucket_of(batch_size: int) -> int:
    return 1 << (max(1, batch_size) - 1).bit_length()
