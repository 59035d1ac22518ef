"""One typed config for a deployment: the Ray cluster, each role's model, replicas and resources, and the
orchestrator. Read from YAML or TOML (`specserve serve --config FILE`); flags override the file."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import OrchestratorConfig
from specserve.config import WorkerServiceConfig
from specserve.flags import flag
from specserve.models.config import ModelConfig
from specserve.models.draft_names import parse_draft_name
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specserve.security import TLSConfig, read_api_key

ROLES = ("draft", "target")
LOOKUP_NUM_CPUS = 0.25
"""CPUs a prompt-lookup draft replica (`ngram`: no model) asks Ray for unless the config says: it keeps token
lists and an n-gram index per session, and asks for no GPU."""


WORKER_KEYS_SET_AT_START = ("host", "port", "tls")
"""WorkerServiceConfig fields a deployment sets for each replica as it starts it (not in a role's config)."""


@dataclass(frozen=True, slots=True)
class RoleConfig:
    """The replicas of one role (draft or target): the worker each one runs and what it asks Ray for. In a
    file, a role's keys are this class's and, beside them, the worker's (model, max_sessions, ...)."""

    worker: WorkerServiceConfig
    """What each replica serves: its model and its server's settings; host, port and TLS are set as it starts."""
    replicas: int = 1
    """Replicas started at launch; `specserve scale` changes the number while serving."""
    num_gpus: float = 0.0
    """GPUs per replica. A fraction below 1 shares a GPU (a small draft); a whole number above 1 spans that
    many GPUs of one node (a large target, its layers split over them by device_map=auto)."""
    num_cpus: float = 1.0
    """CPUs per replica, as Ray accounts them."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources per replica, e.g. {"large_gpu": 1}: pins the role to nodes that declare them."""
    accelerator_type: str | None = None
    """Ray accelerator type (e.g. "L4", "H100"): pins the role to nodes with that GPU."""
    max_restarts: int = -1
    """How often Ray restarts a dead replica (-1: always). A restarted replica rejoins on its own."""
    max_load_failures: int = 3
    """A replica whose process dies this many times in a row while loading its model (before it ever
    serves; e.g. killed by Ray's memory monitor because the node cannot hold it) is not restarted again:
    the fleet stops it and reports why (log, `specserve scale`, specserve_replicas{state="given_up"})."""

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")
        if self.num_gpus < 0 or (self.num_gpus > 1 and not float(self.num_gpus).is_integer()):
            raise ValueError(f"num_gpus must be a fraction up to 1 or a whole number of GPUs, got {self.num_gpus}")
        if self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {self.num_cpus}")
        for name, amount in self.resources.items():
            if not name or amount <= 0 or not math.isfinite(amount):
                raise ValueError(f"resources[{name!r}] must be a positive amount, got {amount}")
        if self.max_restarts < -1:
            raise ValueError(f"max_restarts must be -1 (always) or >= 0, got {self.max_restarts}")
        if self.max_load_failures < 1:
            raise ValueError(f"max_load_failures must be >= 1, got {self.max_load_failures}")
        if self.lookup_only and (self.num_gpus or self.accelerator_type):
            raise ValueError(
                f"num_gpus / accelerator_type: a lookup draft ({self.model.name!r}) loads no model and uses no GPU; "
                f"set num_gpus to 0 and no accelerator_type (got {self.num_gpus}, {self.accelerator_type})"
            )

    @property
    def model(self) -> ModelConfig:
        return self.worker.model

    @property
    def lookup_only(self) -> bool:
        """The replicas serve prompt lookup alone (`ngram`), with no model."""
        return parse_draft_name(self.model.name)[0] is None

    def service(self, host: str, tls: TLSConfig | None = None) -> WorkerServiceConfig:
        """The gRPC server one replica runs, listening on `host` (port chosen when it starts)."""
        return dataclasses.replace(self.worker, host=host, port=0, tls=tls)

    def ray_resources(self) -> dict[str, float]:
        """What one replica asks of its node, in Ray's names (as a KubeRay worker group must offer)."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        if self.accelerator_type:
            wanted[f"accelerator_type:{self.accelerator_type}"] = 0.001
        return {name: amount for name, amount in wanted.items() if amount > 0}


@dataclass(frozen=True, slots=True)
class RayConfig:
    address: str | None = field(default=None, metadata=flag(metavar="RAY_ADDRESS"))
    """None starts a local Ray instance on this machine (on loopback); `auto` joins the cluster this node
    belongs to; `ray://HOST:10001` connects through Ray Client."""
    namespace: str = "specserve"
    worker_host: str = "node-ip"
    """Where workers listen: `node-ip` (the node's address in the Ray cluster) or an interface address."""
    ready_timeout_s: float = 900.0
    """How long start-up waits for the first replica of each role (model download and load included)."""


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """TLS and authentication of the whole deployment, in one place."""

    tls_dir: str | None = field(default=None, metadata=flag(metavar="DIR"))
    """A folder laid out as `specserve certs` writes it (ca.pem, worker.pem, worker-key.pem, orchestrator.pem,
    orchestrator-key.pem), at this path on every node: TLS on every hop; mutual TLS between the
    orchestrator and the workers, which answer no one else. None: plaintext."""
    api_key_file: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """A file holding the public API's bearer token; SPECSERVE_API_KEY, when set, is used instead. Neither:
    the public API asks for no token."""

    def worker_tls(self) -> TLSConfig | None:
        return TLSConfig.from_dir(self.tls_dir, "worker") if self.tls_dir else None

    def apply(self, orchestrator: OrchestratorConfig) -> OrchestratorConfig:
        """`orchestrator` with this TLS and key (files read now, so a bad path fails before anything starts)."""
        tls = TLSConfig.from_dir(self.tls_dir, "orchestrator-public") if self.tls_dir else None
        worker_tls = TLSConfig.from_dir(self.tls_dir, "orchestrator-client") if self.tls_dir else None
        for config in (tls, worker_tls, self.worker_tls()):
            if config is not None:
                config.channel_credentials()  # reads (and so checks) every file
        api_key = read_api_key(self.api_key_file)
        return dataclasses.replace(orchestrator, tls=tls, worker_tls=worker_tls, api_key=api_key)


@dataclass(frozen=True, slots=True)
class DeployConfig:
    target: RoleConfig = field(default_factory=lambda: default_role("target"))
    draft: RoleConfig | None = field(default_factory=lambda: default_role("draft"))
    """None serves target-only."""
    orchestrator: OrchestratorConfig = field(default_factory=OrchestratorConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def __post_init__(self) -> None:
        if self.target.replicas < 1:
            raise ValueError(f"target.replicas must be >= 1, got {self.target.replicas}")
        if parse_draft_name(self.target.model.name)[1]:
            raise ValueError(f"target.model.name: {self.target.model.name!r} is a drafter; a target is a model")

    def role(self, name: str) -> RoleConfig | None:
        return self.target if name == "target" else self.draft


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> DeployConfig:
    """The file's settings (YAML or TOML by suffix), then `overrides` ({"target.replicas": 2, ...})."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_file(Path(path))
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    return config_from_dict(data)


def read_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml  # here: `specserve --help` builds its flags from this module and should not pay for it

        data = yaml.safe_load(text) or {}
    elif path.suffix == ".toml":
        data = tomllib.loads(text)
    else:
        raise ValueError(f"config file must end in .yaml, .yml or .toml, got {path.name}")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def config_from_dict(data: Mapping[str, Any]) -> DeployConfig:
    _check_keys(data, [f.name for f in dataclasses.fields(DeployConfig)], "config")
    kwargs: dict[str, Any] = {}
    if "target" in data:
        kwargs["target"] = _role(data["target"], "target")
    if "draft" in data:
        draft = data["draft"]
        kwargs["draft"] = None if draft is None or draft == "none" else _role(draft, "draft")
    if "orchestrator" in data:
        secured = sorted({"tls", "worker_tls", "api_key"} & set(_mapping(data["orchestrator"], "orchestrator")))
        if secured:
            raise ValueError(f"orchestrator: {secured} are set under security (tls_dir, api_key_file)")
        kwargs["orchestrator"] = _build(OrchestratorConfig, data["orchestrator"], "orchestrator")
    if "security" in data:
        kwargs["security"] = _build(SecurityConfig, data["security"], "security")
    if "ray" in data:
        kwargs["ray"] = _build(RayConfig, data["ray"], "ray")
    return DeployConfig(**kwargs)


def default_role(role: str) -> RoleConfig:
    """A role's replicas when the config says nothing of it: the default model, one replica."""
    return RoleConfig(WorkerServiceConfig(_default_model(role)))


def role_keys() -> list[str]:
    """The keys of a role in a file: RoleConfig's (less `worker`) and the worker's (less those set at start)."""
    return [f.name for f in dataclasses.fields(RoleConfig) if f.name != "worker"] + _worker_keys()


def _worker_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(WorkerServiceConfig) if f.name not in WORKER_KEYS_SET_AT_START]


def _default_model(role: str) -> ModelConfig:
    return ModelConfig.for_role(role, DEFAULT_TARGET if role == "target" else DEFAULT_DRAFT)


def _role(data: Any, where: str) -> RoleConfig:
    data = dict(_mapping(data, where))
    _check_keys(data, role_keys(), where)
    default_model = _default_model(where)
    model = data.pop("model", None)
    if model is None:
        model = default_model
    elif isinstance(model, str):  # shorthand: the name alone, the role's defaults otherwise
        model = dataclasses.replace(default_model, name=model)
    else:
        model = _build(ModelConfig, {"name": default_model.name, **_mapping(model, f"{where}.model")},
                       f"{where}.model", defaults=default_model)  # fmt: skip
    if where == "draft" and parse_draft_name(model.name)[0] is None:
        data.setdefault("num_cpus", LOOKUP_NUM_CPUS)  # prompt lookup: a little CPU, no GPU
    worker = {name: data.pop(name) for name in _worker_keys() if name in data}
    data["worker"] = _build(WorkerServiceConfig, {"model": model, **worker}, where)
    return _build(RoleConfig, data, where)


def _build(cls: type, data: Any, where: str, defaults: Any = None) -> Any:
    data = _mapping(data, where)
    _check_keys(data, [f.name for f in dataclasses.fields(cls)], where)
    if defaults is not None:
        data = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)} | dict(data)
    try:
        return cls(**data)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from error


def _mapping(data: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    return data


def _check_keys(data: Mapping[str, Any], allowed: list[str], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {allowed}")


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for name in parents:
        child = node.get(name)
        if child is None or child == "none":
            child = {}
        elif isinstance(child, str):  # a model given by name alone
            child = {"name": child}
        node[name] = child
        node = child
    node[leaf] = value
