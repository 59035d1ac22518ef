"""RayFleet: the draft and target replicas as Ray actors, placed by each role's resource request.
Ray restarts a dead actor (max_restarts); the fleet starts its server again and reports the new address,
so the orchestrator's discovery picks it up, unless it keeps dying while loading (max_load_failures).
Scaling adds actors, or drains and removes them."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

from deploy.actors import FAILED, IDLE, LISTENING, WorkerActor
from deploy.config import ROLES, DeployConfig, RoleConfig
from orchestrator.replicas import Drain, GivenUp
from specserve.openmp import openmp_env

logger = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 2.0  # a replica that does not answer this fast is restarting, loading or unreachable
STOP_TIMEOUT_S = 15.0
DEAD_AFTER_POLLS = 3  # an actor reported dead this many polls in a row is not coming back: replace it
MAX_REASON_CHARS = 600


class ReplicaStartError(RuntimeError):
    """Every replica of a role failed to start (e.g. the model cannot be loaded)."""


@dataclass(eq=False)
class Member:
    actor: Any  # ray.actor.ActorHandle
    name: str
    state: str = IDLE
    detail: str = ""
    num_dead_polls: int = 0
    load: Any = None
    """wait_loaded() of the current process (a ray.ObjectRef) until it answers; it fails if the process dies."""
    num_load_failures: int = 0
    """Deaths while loading, in a row (a load that completes resets it)."""

    @property
    def address(self) -> str | None:
        return self.detail if self.state == LISTENING else None


class RayFleet:
    def __init__(self, config: DeployConfig) -> None:
        self.config = config
        self._members: dict[str, list[Member]] = {role: [] for role in ROLES}
        self._num_created = dict.fromkeys(ROLES, 0)
        self._num_load_failures = dict.fromkeys(ROLES, 0)
        self._given_up: dict[str, list[GivenUp]] = {role: [] for role in ROLES}
        self._lock = threading.Lock()  # polling runs in worker threads, scaling on the event loop

    def launch(self) -> None:
        for role in ROLES:
            role_config = self.config.role(role)
            if role_config is not None:
                warn_if_unplaceable(role, role_config)
                for _ in range(role_config.replicas):
                    self._spawn(role)

    def desired(self, role: str) -> int:
        with self._lock:
            return len(self._members[role])

    async def addresses(self, role: str) -> list[str]:
        return await asyncio.to_thread(self._poll, role)

    async def scale(self, role: str, num_replicas: int, drain: Drain) -> None:
        if self.config.role(role) is None:
            raise ValueError(f"this deployment has no {role} model configured")
        with self._lock:
            members = list(self._members[role])
        for _ in range(num_replicas - len(members)):
            self._spawn(role)
        if num_replicas >= len(members):
            return
        # stop replicas still starting first (they hold no sessions), then the newest
        victims = sorted(members, key=lambda m: (m.state == LISTENING, members.index(m)))[: len(members) - num_replicas]
        await drain([m.address for m in victims if m.address is not None])  # still listed: no one moves yet
        with self._lock:
            for victim in victims:
                self._members[role].remove(victim)
        await asyncio.gather(*(asyncio.to_thread(_stop, m) for m in victims))

    async def close(self) -> None:
        with self._lock:
            members = [m for role in ROLES for m in self._members[role]]
            for role in ROLES:
                self._members[role].clear()
        await asyncio.gather(*(asyncio.to_thread(_stop, m) for m in members))

    def num_load_failures(self, role: str) -> int:
        with self._lock:
            return self._num_load_failures[role]

    def given_up(self, role: str) -> list[GivenUp]:
        with self._lock:
            return list(self._given_up[role])

    def actors(self, role: str) -> list[Member]:
        with self._lock:
            return list(self._members[role])

    def _spawn(self, role: str) -> Member:
        role_config = self.config.role(role)
        assert role_config is not None
        with self._lock:
            index = self._num_created[role]
            self._num_created[role] += 1
        name = f"specserve-{role}-{index}"
        service = role_config.service(self.config.ray.worker_host, self.config.security.worker_tls())
        actor = (
            ray.remote(WorkerActor)
            .options(
                name=name,
                namespace=self.config.ray.namespace,
                num_cpus=role_config.num_cpus,
                num_gpus=role_config.num_gpus,
                resources=dict(role_config.resources),
                accelerator_type=role_config.accelerator_type,
                max_restarts=role_config.max_restarts,
                max_concurrency=4,  # status() answers while start() or stop() runs
                runtime_env={"env_vars": openmp_env()},  # set before the actor's process loads torch
            )
            .remote(role, service)
        )
        member = Member(actor, name)
        _start(member)
        with self._lock:
            self._members[role].append(member)
        logger.info("started Ray actor %s (%s)", name, _describe(role_config))
        return member

    def _poll(self, role: str) -> list[str]:
        """Ask every replica of `role` how it is; start servers on restarted actors; replace dead ones;
        give up on those that keep dying while loading."""
        members = [m for m in self.actors(role) if self._loading_survived(role, m)]
        refs = [m.actor.status.remote() for m in members]
        for member, ref in zip(members, refs):
            try:
                state, detail = ray.get(ref, timeout=STATUS_TIMEOUT_S)
            except GetTimeoutError:  # busy or unreachable for now: keep what we knew
                continue
            except ActorUnavailableError:  # restarting: its old address is gone
                member.state = IDLE
                continue
            except ActorDiedError as error:  # also seen once while Ray restarts it; dead for good if it stays
                member.state, member.num_dead_polls = IDLE, member.num_dead_polls + 1
                if member.num_dead_polls >= DEAD_AFTER_POLLS:
                    self._replace_dead(role, member, error)
                continue
            member.num_dead_polls = 0
            if state == IDLE:  # new, or restarted by Ray: its server must start (again)
                _start(member)
            elif state == FAILED and member.state != FAILED:
                logger.error("%s failed to start: %s", member.name, detail)
            member.state, member.detail = state, detail
        if members and all(m.state == FAILED for m in members):
            raise ReplicaStartError(f"every {role} replica failed to start: {members[0].detail}")
        given_up = self.given_up(role)
        if not members and given_up:
            raise ReplicaStartError(f"every {role} replica was given up: {given_up[-1].reason}")
        return [m.address for m in members if m.address is not None]

    def _loading_survived(self, role: str, member: Member) -> bool:
        """Count a death while loading (wait_loaded failed); False once the member is given up for it."""
        if member.load is None:
            return True
        ready, _ = ray.wait([member.load], timeout=0)
        if not ready:
            return True
        member.load = None
        try:
            if ray.get(ready[0]):
                member.num_load_failures = 0
            return True  # loaded, or the server failed (status() reports that)
        except RayActorError as error:
            reason = _death_cause(error)
        role_config = self.config.role(role)
        assert role_config is not None
        member.num_load_failures += 1
        with self._lock:
            self._num_load_failures[role] += 1
        if member.num_load_failures < role_config.max_load_failures:
            logger.warning(
                "%s replica %s died while loading (%d of %d deaths in a row before it is given up): %s",
                role, member.name, member.num_load_failures, role_config.max_load_failures, reason,
            )  # fmt: skip
            return True  # once Ray has restarted it, it reports idle: _start() then asks again
        with self._lock:
            if member not in self._members[role]:
                return False
            self._members[role].remove(member)
            self._given_up[role].append(GivenUp(role, member.name, reason, member.num_load_failures))
        ray.kill(member.actor, no_restart=True)
        logger.error(
            "giving up on %s replica %s: it died while loading %d times in a row, not restarting it again "
            "(a replica the node has no memory for dies this way: Ray's line on the worker's exit says how; "
            "the last death: %s)",
            role, member.name, member.num_load_failures, reason,
        )  # fmt: skip
        return False

    def _replace_dead(self, role: str, member: Member, error: BaseException) -> None:
        """Ray gave up on the actor (restarts exhausted, or its node is gone for good): start a new one."""
        with self._lock:
            if member not in self._members[role]:
                return
            self._members[role].remove(member)
        logger.warning("%s is dead (%s); replacing it", member.name, error)
        self._spawn(role)


def _start(member: Member) -> None:
    member.actor.start.remote()
    if member.load is None:
        member.load = member.actor.wait_loaded.remote()


def _death_cause(error: BaseException) -> str:
    """What the caller of a dead actor learns, on one line: Ray's account where it gives one (killed by
    its memory monitor), else that the process exited (the raylet logs the exit type beside it)."""
    text = " ".join(str(error).split())
    text = text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."
    return f"its process exited while loading the model ({type(error).__name__}: {text})"


def _stop(member: Member) -> None:
    try:
        ray.get(member.actor.stop.remote(), timeout=STOP_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - it is being removed either way
        logger.debug("graceful stop of %s failed: %s", member.name, error)
    ray.kill(member.actor, no_restart=True)
    logger.info("stopped %s", member.name)


def _describe(role: RoleConfig) -> str:
    return f"{role.model.name}, " + ", ".join(f"{k}={v:g}" for k, v in role.ray_resources().items())


def warn_if_unplaceable(role: str, role_config: RoleConfig) -> None:
    """Say so at once when no node could take a replica (it would wait silently for one to join)."""
    wanted = role_config.ray_resources()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not any(all(node.get(k, 0) >= v for k, v in wanted.items()) for node in nodes):
        offered = [{k: v for k, v in node.items() if not k.startswith("node:") and k != "object_store_memory"}
                   for node in nodes]  # fmt: skip
        logger.warning(
            "no node in the Ray cluster can take a %s replica (wants %s; nodes offer %s): it waits until one "
            "joins (an autoscaling cluster adds it)",
            role, wanted, offered,
        )  # fmt: skip
