"""Draft and verify calls taking turns, for a draft and a target that compute on the same CPU cores: a call
waits while calls of the other phase are in flight, and when a phase's last call returns the sessions waiting
for the other phase go in together, so each pass batches them all (docs/architecture.md, "Shared cores").
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator


class Phase(enum.Enum):
    DRAFT = "draft"
    VERIFY = "verify"

    @property
    def other(self) -> Phase:
        return Phase.VERIFY if self is Phase.DRAFT else Phase.DRAFT


class Turns:
    """Calls of one phase at a time, in turns. A turn is for the sessions waiting for it when it opens and
    for those of the turn before, which go on with this phase a moment later. Any other session that
    arrives during a turn of its phase waits for the next one: joined late, it would miss the pass the
    others' calls already started, and run a pass of its own after it. Except a call that may join late
    (`late_ok`: a verification without drafts) while no session waits for the other phase: its pass
    then holds up nobody."""

    def __init__(self) -> None:
        self.phase = Phase.VERIFY
        self.num_in_flight = 0
        self._members: set[str] = set()  # the sessions that entered the turn in flight
        self._invited: set[str] = set()  # the turn before's, welcome in this one
        self._waiting: dict[Phase, set[str]] = {phase: set() for phase in Phase}
        self._opened = {phase: asyncio.Event() for phase in Phase}

    @contextlib.asynccontextmanager
    async def take(self, phase: Phase, session_id: str, late_ok: bool = False) -> AsyncIterator[None]:
        await self._enter(phase, session_id, late_ok)
        try:
            yield
        finally:
            self._leave()

    async def _enter(self, phase: Phase, session_id: str, late_ok: bool) -> None:
        welcome = session_id in self._invited or (late_ok and not self._waiting[phase.other])
        if self.num_in_flight == 0 or (self.phase is phase and welcome):
            self.phase, self.num_in_flight = phase, self.num_in_flight + 1
            self._join(session_id)
            return
        opened = self._opened[phase]
        self._waiting[phase].add(session_id)
        try:
            await opened.wait()  # _leave counts this call in when it opens the turn
        except asyncio.CancelledError:
            if opened.is_set():  # let in, then cancelled: leave like a call that ran
                self._leave()
            else:
                self._waiting[phase].discard(session_id)
            raise
        self._join(session_id)

    def _join(self, session_id: str) -> None:
        self._members.add(session_id)
        self._invited.discard(session_id)

    def _leave(self) -> None:
        self.num_in_flight -= 1
        if self.num_in_flight:
            return
        self._invited, self._members = self._members, set()
        for phase in (self.phase.other, self.phase):
            if waiting := self._waiting[phase]:
                self.phase, self.num_in_flight, self._waiting[phase] = phase, len(waiting), set()
                self._opened[phase].set()
                self._opened[phase] = asyncio.Event()
                return
