"""A timed load run's window: it opens a warm-up after every client's first token, not after the start."""

from __future__ import annotations

import math
import threading
import time

from specserve.bench.load import Opening, Window


def test_the_window_opens_a_warmup_after_the_last_clients_first_token() -> None:
    window = Window(math.inf)
    opening = Opening(window, num_clients=3, warmup_s=0.2, duration_s=0.3)
    opening.client_started(0)
    opening.client_started(0)  # the same client again (its first request also ended): no change
    opening.client_started(2)
    assert window.start == math.inf and window.end == math.inf  # client 1 has not had its first token
    time.sleep(0.05)
    last = time.perf_counter()
    opening.client_started(1)
    assert last + 0.2 <= window.start <= time.perf_counter() + 0.2
    assert window.end == window.start + 0.3
    timer = threading.Thread(target=opening.close_at_end)
    timer.start()
    timer.join(timeout=5.0)
    assert window.closed and time.perf_counter() >= window.end


def test_a_run_that_ends_before_its_window_opened_stops_the_timer() -> None:
    window = Window(math.inf)
    opening = Opening(window, num_clients=2, warmup_s=0.0, duration_s=60.0)
    timer = threading.Thread(target=opening.close_at_end)
    timer.start()
    opening.client_started(0)  # client 1 never got a token
    opening.stop()
    timer.join(timeout=5.0)
    assert not timer.is_alive() and not window.closed and window.start == math.inf
