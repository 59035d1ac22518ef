"""A served stack (draft, target, orchestrator) on ephemeral loopback ports, run on an event loop in a
background thread, so synchronous tests can call it through the real gRPC clients."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from specserve.config import WorkerServiceConfig
from specserve.models.loading import ModelConfig
from specserve.security import TLSConfig


class LocalStack:
    def __init__(
        self,
        target: str = "tiny",
        draft: str | None = "tiny-draft",
        k: int = 4,
        pipelined: bool = True,
        num_targets: int = 1,
        certs: Path | None = None,
        api_key: str | None = None,
        orchestrator: dict[str, Any] | None = None,
        interceptors: dict[str, list[Any]] | None = None,
        http: bool = False,
        workers: dict[str, Any] | None = None,
        engine: str = "auto",
    ):
        """certs: a folder `specserve certs` wrote: TLS everywhere, mutual between orchestrator and workers;
        api_key: the orchestrator requires it; orchestrator: OrchestratorConfig fields to override;
        interceptors: gRPC server interceptors per worker name ("target", "target-1", "draft"), to inject faults;
        workers: WorkerServiceConfig fields to override in every worker; engine: the workers' model engine."""
        self.orchestrator_overrides, self.interceptors = orchestrator or {}, interceptors or {}
        self.worker_overrides = workers or {}
        self.target_name, self.draft_name, self.k, self.pipelined = target, draft, k, pipelined
        self.certs, self.api_key = certs, api_key
        self.http, self.http_url = http, ""  # http: serve the OpenAI-compatible API too, at http_url (a free port)
        self.num_targets = num_targets
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="stack-loop", daemon=True)
        self.stops: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, Future[None]] = {}
        self.addresses: dict[str, str] = {}

    def __enter__(self) -> LocalStack:
        self.thread.start()
        try:
            for i in range(self.num_targets):
                self.start_worker("target", name="target" if i == 0 else f"target-{i}")
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

    def start_worker(self, role: str, port: int = 0, name: str | None = None, model: str | None = None) -> str:
        """Start a `role` server, known as `name` (default: the role), serving `model` (default: the role's)."""
        if role == "draft":
            from draft_service.server import serve
        else:
            from target_service.server import serve
        model = model or (self.draft_name if role == "draft" else self.target_name)
        assert model is not None
        tls = TLSConfig.from_dir(self.certs, "worker") if self.certs else None
        model_config = ModelConfig(model, device="cpu", dtype="float32", engine=self.engine)
        config = WorkerServiceConfig(model_config, port=port, tls=tls, **self.worker_overrides)
        name = name or role
        return self._start(name, functools.partial(serve, interceptors=self.interceptors.get(name, ())), config)

    def stop_worker(self, name: str, timeout: float = 30.0) -> None:
        self.loop.call_soon_threadsafe(self.stops[name].set)
        self.tasks[name].result(timeout)

    def start_orchestrator(self) -> str:
        from orchestrator.replicas import StaticFleet
        from orchestrator.server import serve
        from orchestrator.service import OrchestratorConfig

        k = self.k if self.draft_name else 0
        config = OrchestratorConfig(
            num_speculative_tokens=k,
            pipelined=self.pipelined,
            port=0,
            tls=TLSConfig.from_dir(self.certs, "orchestrator-public") if self.certs else None,
            worker_tls=TLSConfig.from_dir(self.certs, "orchestrator-client") if self.certs else None,
            api_key=self.api_key,
            # every worker here shares this machine's cores; a lone session pre-drafts as on separate
            # hardware (the pipelined path, the one with more to test) unless a test asks otherwise
            **({"http_port": 0 if self.http else None, "yield_shared_cores": False} | self.orchestrator_overrides),
        )
        fleet = StaticFleet(
            {role: [a for name, a in self.addresses.items() if name.startswith(role)] for role in ("target", "draft")}
        )
        on_http = functools.partial(setattr, self, "http_url")
        return self._start("orchestrator", functools.partial(serve, fleet=fleet, on_http_listening=on_http), config)

    @property
    def address(self) -> str:
        return self.addresses["orchestrator"]

    def close(self) -> None:
        for name in ["orchestrator", *[n for n in self.stops if n != "orchestrator"]]:
            if not self.tasks[name].done():
                self.loop.call_soon_threadsafe(self.stops[name].set)
                try:
                    self.tasks[name].result(30)
                except Exception:  # noqa: BLE001 - teardown must go on
                    pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _make_event() -> asyncio.Event:
    return asyncio.Event()
