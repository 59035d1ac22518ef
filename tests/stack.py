"""A served stack (draft, target, orchestrator) on ephemeral loopback ports, run on an event loop in a
background thread, so synchronous tests can call it through the real gRPC clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from specserve.config import WorkerServiceConfig
from specserve.models.loading import ModelConfig


class LocalStack:
    def __init__(self, target: str = "tiny", draft: str | None = "tiny-draft", k: int = 4, pipelined: bool = True):
        self.target_name, self.draft_name, self.k, self.pipelined = target, draft, k, pipelined
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack-loop", daemon=True)
        self.stops: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, Future[None]] = {}
        self.addresses: dict[str, str] = {}

    def __enter__(self) -> LocalStack:
        self.thread.start()
        try:
            self.start_worker("target")
            if self.draft_name is not None:
                self.start_worker("draft")
            self.start_orchestrator()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _start(self, name: str, serve: Callable[..., Coroutine[Any, Any, None]], config: Any) -> str:
        listening: Future[str] = Future()
        stop = self.call(_make_event())
        self.stops[name] = stop
        task = asyncio.run_coroutine_threadsafe(serve(config, on_listening=listening.set_result, stop=stop), self.loop)
        self.tasks[name] = task
        deadline = time.monotonic() + 120
        while not listening.done():
            if task.done():
                task.result()  # the server failed before listening: raise its error here
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not start listening")
            time.sleep(0.02)
        self.addresses[name] = listening.result()
        return self.addresses[name]

    def start_worker(self, role: str, port: int = 0) -> str:
        if role == "draft":
            from draft_service.server import serve
        else:
            from target_service.server import serve
        name = self.draft_name if role == "draft" else self.target_name
        assert name is not None
        config = WorkerServiceConfig(ModelConfig(name, device="cpu", dtype="float32"), port=port)
        return self._start(role, serve, config)

    def stop_worker(self, role: str, timeout: float = 30.0) -> None:
        self.loop.call_soon_threadsafe(self.stops[role].set)
        self.tasks[role].result(timeout)

    def start_orchestrator(self) -> str:
        from orchestrator.server import serve
        from orchestrator.service import OrchestratorConfig

        config = OrchestratorConfig(
            target_address=self.addresses["target"],
            draft_address=self.addresses.get("draft"),
            num_speculative_tokens=self.k if self.draft_name else 0,
            pipelined=self.pipelined,
            port=0,
        )
        return self._start("orchestrator", serve, config)

    @property
    def address(self) -> str:
        return self.addresses["orchestrator"]

    def close(self) -> None:
        for name in ("orchestrator", "draft", "target"):
            if name in self.stops and not self.tasks[name].done():
                self.loop.call_soon_threadsafe(self.stops[name].set)
                try:
                    self.tasks[name].result(30)
                except Exception:  # noqa: BLE001 - teardown must go on
                    pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _make_event() -> asyncio.Event:
    return asyncio.Event()
