"""A draft or target gRPC server inside a Ray actor: the same serve() as `python -m target_service`,
on an event loop of its own, listening on the node's address. The actor owns its model and server;
Ray owns placement and restarts."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import Future
from dataclasses import replace

from specserve.config import WorkerServiceConfig
from specserve.logs import configure_logging

logger = logging.getLogger(__name__)

IDLE, STARTING, LISTENING, FAILED = "idle", "starting", "listening", "failed"


class WorkerActor:
    """Cheap __init__ (Ray re-runs it on restart); start() launches the server and returns at once;
    status() says how far it got and where it listens; wait_loaded() returns once the model is loaded."""

    def __init__(self, role: str, config: WorkerServiceConfig) -> None:
        if role not in ("draft", "target"):
            raise ValueError(f"role must be draft or target, got {role!r}")
        self.role, self.config = role, config
        configure_logging(logging.INFO)  # request ids on every line; JSON when SPECSERVE_LOG_FORMAT=json
        self._lock = threading.Lock()
        self._state, self._detail = IDLE, ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._done: Future[None] = Future()
        self._loaded = threading.Event()  # set once the model serves, or the server ended without serving
        self._served = False

    def start(self) -> None:
        with self._lock:
            if self._state != IDLE:
                return
            self._state = STARTING
        threading.Thread(target=self._run, name=f"specserve-{self.role}", daemon=True).start()

    def status(self) -> tuple[str, str]:
        """(state, address when listening or the error when failed)."""
        with self._lock:
            return self._state, self._detail

    async def wait_loaded(self) -> bool:
        """Return once the model serves (True) or the server failed (False). A process that dies while
        loading fails this call instead, with Ray's account of the death (the memory monitor, a signal).
        Async, as Ray runs this actor's methods on one event loop (it has a coroutine): it must not block."""
        while not self._loaded.is_set():
            await asyncio.sleep(0.1)
        return self._served

    def where(self) -> dict[str, object]:
        """The node and process this replica runs in, and what Ray assigned it (for tests and operators)."""
        import ray

        context = ray.get_runtime_context()
        state, detail = self.status()
        return {
            "node_id": context.get_node_id(),
            "pid": os.getpid(),
            "resources": context.get_assigned_resources(),
            "address": detail if state == LISTENING else None,
        }

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving (sessions in flight are given a grace period), then return."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._done.result(timeout_s)

    def _run(self) -> None:
        import torch
        from transformers.utils import logging as transformers_logging

        from specserve.models.loading import cpu_threads

        # both roles load at once and Ray forwards their output line by line: two progress bars would
        # interleave on every start; the log says what loads and when it is done
        transformers_logging.disable_progress_bar()

        torch.set_num_threads(cpu_threads(self.role, self.config.cpu_threads))  # Ray caps OMP_NUM_THREADS at num_cpus
        config = replace(self.config, host=_listen_host(self.config.host))
        try:
            asyncio.run(self._serve(config))
            self._done.set_result(None)
        except BaseException as error:  # noqa: BLE001 - reported through status()
            logger.exception("%s server failed", self.role)
            with self._lock:
                self._state, self._detail = FAILED, f"{type(error).__name__}: {error}"
            self._done.set_exception(error)
        finally:
            self._loaded.set()

    async def _serve(self, config: WorkerServiceConfig) -> None:
        if self.role == "draft":
            from draft_service.server import serve
        else:
            from target_service.server import serve
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        def on_listening(address: str) -> None:
            with self._lock:
                self._state, self._detail = LISTENING, address

        def on_serving() -> None:
            self._served = True
            self._loaded.set()

        await serve(config, on_listening=on_listening, stop=self._stop, on_serving=on_serving)


def _listen_host(host: str) -> str:
    """`node-ip`: the address this node has in the Ray cluster, where other nodes reach it."""
    if host != "node-ip":
        return host
    import ray

    return str(ray.util.get_node_ip_address())
