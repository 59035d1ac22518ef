"""SessionStore: TTL eviction, LRU cap, NOT_FOUND for unknown ids."""

from __future__ import annotations

import pytest

from specserve.worker.sessions import SessionNotFoundError, SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_get_put_pop() -> None:
    store: SessionStore[str] = SessionStore(4, 10.0)
    store.put("a", "A")
    assert store.get("a") == "A" and "a" in store and len(store) == 1
    assert store.pop("a") == "A" and store.pop("a") is None
    with pytest.raises(SessionNotFoundError, match="unknown session 'a'"):
        store.get("a")


def test_idle_sessions_expire() -> None:
    clock = Clock()
    store: SessionStore[str] = SessionStore(4, 10.0, clock)
    store.put("a", "A")
    store.put("b", "B")
    clock.now = 6.0
    store.get("a")  # touching keeps it alive
    clock.now = 12.0
    assert store.evict_idle() == ["b"]
    assert store.get("a") == "A"
    clock.now = 30.0
    with pytest.raises(SessionNotFoundError):
        store.get("a")
    assert store.num_evicted == 2


def test_least_recently_used_is_evicted_past_the_cap() -> None:
    store: SessionStore[int] = SessionStore(2, 100.0)
    store.put("a", 1)
    store.put("b", 2)
    store.get("a")
    assert store.put("c", 3) == ["b"]
    assert "a" in store and "c" in store and "b" not in store


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        SessionStore(0, 1.0)
    with pytest.raises(ValueError, match="idle_ttl_s"):
        SessionStore(1, 0.0)
