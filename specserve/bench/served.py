"""The served stack for `specserve bench latency --served`: draft and target services in child processes,
orchestrators of each kind over them in this process, called through the gRPC client.
(Processes rather than Ray actors: the same servers, with nothing else on the bench's two cores.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

from specserve.bench.config import (
    EARLY_STOP,
    NO_SEQUENTIAL_STOP,
    PIPELINED,
    SHARED_CORES_PIPELINED,
    UNPIPELINED,
    BenchConfig,
    Prompt,
    Runner,
    RunOutput,
)
from specserve.bench.overhead import stats_from_proto
from specserve.launcher import Workers, extra_draft_role, free_port, worker_processes
from specserve.models.config import ModelConfig

if TYPE_CHECKING:
    from specserve_client import SpecServeClient




def draft_variant(name: str) -> str:
    """The served variant whose orchestrator (the default one) uses the extra draft worker `name`."""
    return f"draft {name}"


class ServedStack:
    """Orchestrators over the same two workers: the default (pipelined), unpipelined, pipelined with the
    draft's early stop at `confidence_threshold` (the load sweep's '+stop' modes), pipelined even on
    shared cores (where the default runs rounds in turn: specserve/placement.py), and the
    default without its early stop in rounds run in turn."""

    def __init__(
        self,
        target: ModelConfig,
        draft: ModelConfig,
        confidence_threshold: float = 0.3,
        worker_args: Sequence[str] = (),
        extra_drafts: Sequence[ModelConfig] = (),
    ) -> None:
        """worker_args: added to every worker's command line (e.g. --prefill-chunk-tokens N); extra_drafts:
        more draft workers (e.g. `ngram`, `MODEL+ngram`), each with a default orchestrator over the same
        target worker, as the variant `draft_variant(name)`."""
        self.target, self.draft, self.confidence_threshold = target, draft, confidence_threshold
        self.worker_args, self.extra_drafts = worker_args, extra_drafts
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="served-bench", daemon=True)
        self.exits = ExitStack()
        self.stop: asyncio.Event | None = None
        self.addresses: dict[str, str] = {}  # variant -> orchestrator address
        self.tasks: list[asyncio.Future[None]] = []

    def __enter__(self) -> ServedStack:
        from orchestrator.replicas import StaticFleet
        from orchestrator.server import serve
        from orchestrator.service import OrchestratorConfig
        from specserve_client import SpecServeClient

        workers = self.exits.enter_context(
            worker_processes(self.target, self.draft, self.worker_args, self.extra_drafts)
        )
        self.thread.start()
        self.stop = asyncio.run_coroutine_threadsafe(_event(), self.loop).result()
        variants = {
            PIPELINED: OrchestratorConfig(port=free_port(), http_port=None),
            UNPIPELINED: OrchestratorConfig(pipelined=False, port=free_port(), http_port=None),
            EARLY_STOP: OrchestratorConfig(
                draft_confidence_threshold=self.confidence_threshold, port=free_port(), http_port=None
            ),
            SHARED_CORES_PIPELINED: OrchestratorConfig(yield_shared_cores=False, port=free_port(), http_port=None),
            NO_SEQUENTIAL_STOP: OrchestratorConfig(
                sequential_confidence_threshold=0.0, port=free_port(), http_port=None
            ),
        }
        drafts = {variant: workers["draft"] for variant in variants}
        for model in self.extra_drafts:
            variant = draft_variant(model.name)
            variants[variant] = OrchestratorConfig(port=free_port(), http_port=None)
            drafts[variant] = workers[extra_draft_role(model.name)]
        for variant, config in variants.items():
            fleet = StaticFleet({"target": [workers["target"]], "draft": [drafts[variant]]})
            self.tasks.append(asyncio.run_coroutine_threadsafe(serve(config, fleet, stop=self.stop), self.loop))
            self.addresses[variant] = f"127.0.0.1:{config.port}"
        self.clients = {p: SpecServeClient(a) for p, a in self.addresses.items()}
        for client in self.clients.values():  # the orchestrators listen once both workers have loaded
            _wait_for(client, self.tasks, workers)
        return self

    def __exit__(self, *exc: object) -> None:
        for client in getattr(self, "clients", {}).values():
            client.close()
        if self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        for task in self.tasks:
            try:
                task.result(30)
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.exits.close()

    def runner(self, k: int | None, variant: str, cfg: BenchConfig) -> Runner:
        """k None: the request leaves k to the server (adaptive k, its default)."""
        return client_runner(self.clients[variant], k, cfg)

    @property
    def load_clients(self) -> dict[bool | str, SpecServeClient]:
        """For the load sweep: early_stop, or an extra draft's name -> client."""
        extra: dict[bool | str, SpecServeClient] = {
            m.name: self.clients[draft_variant(m.name)] for m in self.extra_drafts
        }
        return {False: self.clients[PIPELINED], True: self.clients[EARLY_STOP], **extra}


def client_runner(client: SpecServeClient, k: int | None, cfg: BenchConfig) -> Runner:
    """A bench mode that sends each prompt through the public gRPC API and times it end to end."""

    def run(prompt: Prompt) -> RunOutput:
        started = time.perf_counter()
        response = client.generate(
            prompt.text, max_tokens=cfg.max_tokens, num_speculative_tokens=k, ignore_eos=cfg.ignore_eos
        )
        seconds = time.perf_counter() - started
        stats = stats_from_proto(response.stats)
        return list(response.token_ids), seconds, stats, 0

    return run


async def _event() -> asyncio.Event:
    return asyncio.Event()


def _wait_for(client: object, tasks: list[asyncio.Future[None]], workers: Workers, timeout_s: float = 900.0) -> None:
    import grpc

    deadline = time.monotonic() + timeout_s
    while True:
        workers.raise_if_exited()
        for task in tasks:
            if task.done():
                task.result()  # an orchestrator failed: raise its error
        try:
            client.info()  # type: ignore[attr-defined]
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
