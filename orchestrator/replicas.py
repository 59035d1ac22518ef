"""The replicas of one role as the orchestrator sees them: discovered from a Fleet, admitted once they
serve the same model, and handed to new sessions least-loaded first. A session keeps its replica (its
KV cache lives there) until that replica fails; then the request moves to another one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.remote import DraftClient, ModelInfo, TargetClient
from orchestrator.turns import Turns
from specserve.adaptive import AdaptiveConfig, AdaptivePolicy
from specserve.rpc import PreconditionError

logger = logging.getLogger(__name__)

Drain = Callable[[Sequence[str]], Awaitable[None]]
"""Stop sending new sessions to these addresses and wait (bounded) for their sessions to finish."""


class ScalingUnsupportedError(PreconditionError):
    """The fleet's replicas are fixed addresses; nothing can start or stop them."""


@dataclass(frozen=True, slots=True)
class GivenUp:
    """A replica the fleet stopped restarting: its process died while loading, `num_failures` times in a row."""

    role: str
    name: str
    reason: str
    """The last death's cause, as Ray gave it (e.g. killed by its memory monitor, or by a signal)."""
    num_failures: int


class Fleet(Protocol):
    """Where replicas come from: fixed addresses (StaticFleet) or actors on a Ray cluster (deploy/)."""

    async def addresses(self, role: str) -> list[str]:
        """Addresses of the role's replicas that are listening now (they may still be loading)."""
        ...

    def desired(self, role: str) -> int:
        """How many replicas of the role the fleet is keeping (started or starting)."""
        ...

    async def scale(self, role: str, num_replicas: int, drain: Drain) -> None:
        """Start or stop replicas until `num_replicas` run; replicas to stop are drained first."""
        ...

    def num_load_failures(self, role: str) -> int:
        """Replica processes of the role that died while loading, since the fleet started."""
        ...

    def given_up(self, role: str) -> list[GivenUp]:
        """Replicas of the role the fleet stopped restarting (not counted in desired())."""
        ...

    async def close(self) -> None: ...


class StaticFleet:
    """Replicas at fixed addresses, started by someone else (tests, `python -m target_service`)."""

    def __init__(self, addresses: dict[str, Sequence[str]]) -> None:
        self._addresses = {role: list(a) for role, a in addresses.items()}

    async def addresses(self, role: str) -> list[str]:
        return list(self._addresses.get(role, []))

    def desired(self, role: str) -> int:
        return len(self._addresses.get(role, []))

    async def scale(self, role: str, num_replicas: int, drain: Drain) -> None:
        raise ScalingUnsupportedError("this orchestrator serves fixed addresses; scale needs a Ray deployment")

    def num_load_failures(self, role: str) -> int:
        return 0  # someone else starts (and restarts) these replicas

    def given_up(self, role: str) -> list[GivenUp]:
        return []

    async def close(self) -> None:
        return None


WorkerClient = DraftClient | TargetClient


@dataclass(slots=True)
class PrefillTiming:
    """A prefill's seconds, and whether it ran alone: no other prefill on the replica started before it
    ended (one beside another waits for it, so its seconds are not what a prefill costs)."""

    alone: bool
    seconds: float = 0.0


@dataclass(eq=False)
class Replica:
    address: str
    client: WorkerClient
    info: ModelInfo | None = None
    num_sessions: int = 0
    draining: bool = False
    failed: bool = False
    """A call failed; no new sessions until a health check passes again."""
    speculation: AdaptivePolicy | None = None
    """The adaptive k its sessions share (made on first use)."""
    turn_taking: Turns | None = None
    """Its sessions' draft and verify turns, where they share cores with their drafts (made on first use)."""
    num_prefilling: int = 0
    """Prefills this orchestrator sent to it that are in flight. On a target a new request's draft prefills
    beside its target's, inside this one's time; a draft catching up on a context is on its draft's clock,
    not the target's: on separate hardware it holds only its own session, and on the target's cores it runs
    in a draft turn, so the rounds at k > 0 pay for it in their round times (not target-only's, as a stall
    priced at every k would)."""
    _prefilled_s: float = 0.0
    _prefilling_since: float = 0.0
    _prefills_started: int = 0

    @contextlib.contextmanager
    def prefilling(self) -> Iterator[PrefillTiming]:
        """A prefill in flight, on the prefill clock; its timing once it returns."""
        timing = PrefillTiming(alone=not self.num_prefilling)
        started = time.perf_counter()
        if timing.alone:
            self._prefilling_since = started
        self.num_prefilling += 1
        self._prefills_started += 1
        number = self._prefills_started
        try:
            yield timing
        finally:
            ended = time.perf_counter()
            self.num_prefilling -= 1
            if not self.num_prefilling:
                self._prefilled_s += ended - self._prefilling_since
            timing.seconds, timing.alone = ended - started, timing.alone and number == self._prefills_started

    def prefill_clock(self) -> float:
        """Seconds during which a prefill on it ran, so far: what it advanced by during a round is how long
        the round stood beside one (AdaptivePolicy.observe)."""
        running = time.perf_counter() - self._prefilling_since if self.num_prefilling else 0.0
        return self._prefilled_s + running

    def turns(self) -> Turns:
        if self.turn_taking is None:
            self.turn_taking = Turns()
        return self.turn_taking

    def adaptive_k(self, max_k: int) -> AdaptivePolicy:
        if self.speculation is None or self.speculation.max_k != max_k:
            self.speculation = AdaptivePolicy(AdaptiveConfig(max_k=max_k, initial_k=min(4, max_k)))
        return self.speculation

    @property
    def state(self) -> str:
        return "failed" if self.failed else "draining" if self.draining else "serving"


class ReplicaPool:
    def __init__(
        self,
        role: str,
        make_client: Callable[[str], WorkerClient],
        check: Callable[[ModelInfo], None] | None = None,
    ) -> None:
        self.role, self.make_client, self.check = role, make_client, check
        self.replicas: dict[str, Replica] = {}
        self.info: ModelInfo | None = None
        """The model every replica must serve: the first admitted replica's."""
        self.refused: dict[str, ValueError] = {}
        """Replicas turned away, and why (a different model or tokenizer)."""
        self._changed = asyncio.Condition()

    @property
    def service(self) -> str:
        return f"specserve.v1.{self.role.capitalize()}Service"

    def pick(self) -> Replica | None:
        """The usable replica with the fewest sessions, or None."""
        usable = [r for r in self.replicas.values() if not (r.failed or r.draining)]
        return min(usable, key=lambda r: r.num_sessions, default=None)

    async def acquire(self, timeout_s: float) -> Replica | None:
        """Pick a replica and count a session on it, waiting up to `timeout_s` for one to be usable."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.pick() is not None), timeout_s)
            except TimeoutError:
                return None
            replica = self.pick()
            assert replica is not None
            replica.num_sessions += 1
            return replica

    def try_acquire(self) -> Replica | None:
        replica = self.pick()
        if replica is not None:
            replica.num_sessions += 1
        return replica

    def release(self, replica: Replica) -> None:
        replica.num_sessions -= 1
        self._notify()

    def mark_failed(self, replica: Replica, error: BaseException) -> None:
        if not replica.failed:
            logger.warning("%s replica %s failed (%s); moving its sessions", self.role, replica.address, error)
        replica.failed = True

    async def sync(self, addresses: Sequence[str]) -> None:
        """Admit new addresses that serve the right model, re-check failed ones, drop vanished ones."""
        for address in set(self.replicas) - set(addresses):
            self._remove(address, "left the fleet")
        for address in addresses:
            replica = self.replicas.get(address)
            if replica is None:
                await self._admit(address)
            elif replica.failed and await _is_serving(replica.client.channel, self.service):
                logger.info("%s replica %s answers again", self.role, address)
                replica.failed = False
        self._notify()

    async def drain(self, addresses: Sequence[str], timeout_s: float) -> None:
        draining = [self.replicas[a] for a in addresses if a in self.replicas]
        for replica in draining:
            replica.draining = True
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: all(r.num_sessions == 0 for r in draining)), timeout_s
                )
            except TimeoutError:
                busy = {r.address: r.num_sessions for r in draining if r.num_sessions}
                logger.warning("drain timed out after %.0fs with sessions left %s; they fail over", timeout_s, busy)
        for replica in draining:
            self._remove(replica.address, "drained")

    async def close(self) -> None:
        for address in list(self.replicas):
            self._remove(address, "closing")

    async def _admit(self, address: str) -> None:
        client = self.make_client(address)
        try:
            if not await _is_serving(client.channel, self.service):
                await client.close()  # still loading: the next sync looks again
                return
            info = await client.model_info()
        except grpc.aio.AioRpcError as error:
            logger.debug("%s replica %s not ready: %s", self.role, address, error.code())
            await client.close()
            return
        try:
            if self.info is not None and _identity(info) != _identity(self.info):
                raise ValueError(
                    f"it serves {info.model!r} (tokenizer {info.tokenizer_fingerprint[:12]}), the others "
                    f"{self.info.model!r} (tokenizer {self.info.tokenizer_fingerprint[:12]})"
                )
            if self.check is not None:
                self.check(info)
        except ValueError as error:  # TokenizerMismatchError is one
            if address not in self.refused:
                logger.error("refusing %s replica %s: %s", self.role, address, error)
            self.refused[address] = error
            await client.close()
            return
        self.info = self.info or info
        self.replicas[address] = Replica(address, client, info)
        logger.info("%s replica %s joined (%d serving)", self.role, address, len(self.replicas))

    def _remove(self, address: str, why: str) -> None:
        replica = self.replicas.pop(address, None)
        if replica is None:
            return
        replica.failed = True  # sessions still holding it move elsewhere on their next failed call
        asyncio.ensure_future(replica.client.close(grace_s=5.0))
        logger.info("%s replica %s removed (%s)", self.role, address, why)

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.ensure_future(notify())


def _identity(info: ModelInfo) -> tuple[str, str, int, int]:
    return info.model, info.tokenizer_fingerprint, info.vocab_size, info.max_context


async def _is_serving(channel: grpc.aio.Channel, service: str, timeout_s: float = 2.0) -> bool:
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
        )
    except grpc.aio.AioRpcError:
        return False
    return response.status == health_pb2.HealthCheckResponse.SERVING
