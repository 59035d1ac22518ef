"""Per-request state kept by a worker between calls: created at prefill, released at completion,
evicted when idle past a TTL or, least recently used first, past a size cap."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SessionNotFoundError(KeyError):
    """The session does not exist: never created, released, or evicted."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r} (never created, released, or evicted)"


class SessionStore(Generic[T]):
    def __init__(self, max_sessions: int, idle_ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if idle_ttl_s <= 0:
            raise ValueError(f"idle_ttl_s must be > 0, got {idle_ttl_s}")
        self.max_sessions, self.idle_ttl_s, self.clock = max_sessions, idle_ttl_s, clock
        self._sessions: OrderedDict[str, tuple[T, float]] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.num_evicted = 0

    def put(self, session_id: str, session: T) -> list[str]:
        """Add or replace; return the ids evicted to make room (idle ones first, then the LRU)."""
        with self._lock:
            self._sessions.pop(session_id, None)
            evicted = self._evict_idle_locked()
            while len(self._sessions) >= self.max_sessions:
                evicted.append(self._sessions.popitem(last=False)[0])
            self._sessions[session_id] = (session, self.clock())
            self.num_evicted += len(evicted)
            return evicted

    def get(self, session_id: str) -> T:
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            if entry is None or self.clock() - entry[1] > self.idle_ttl_s:
                if entry is not None:
                    self.num_evicted += 1
                raise SessionNotFoundError(session_id)
            self._sessions[session_id] = (entry[0], self.clock())  # most recently used now
            return entry[0]

    def pop(self, session_id: str) -> T | None:
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            return None if entry is None else entry[0]

    def evict_idle(self) -> list[str]:
        with self._lock:
            evicted = self._evict_idle_locked()
            self.num_evicted += len(evicted)
            return evicted

    def _evict_idle_locked(self) -> list[str]:
        now = self.clock()
        idle = [sid for sid, (_, used) in self._sessions.items() if now - used > self.idle_ttl_s]
        for sid in idle:
            del self._sessions[sid]
        return idle

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions
