"""The deployment files (deploy/k8s, deploy/ray, deploy/docker) agree with deploy/configs/cluster.yaml:
every role's replicas fit where its resources are declared, one image everywhere, the API port reachable."""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.config import ROLES, DeployConfig, RoleConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "configs" / "cluster.yaml"
RAYJOB = ROOT / "deploy" / "k8s" / "specserve-rayjob.yaml"
LAUNCHER = ROOT / "deploy" / "ray" / "cluster.yaml"
DOCKERFILES = [ROOT / "deploy" / "docker" / f"Dockerfile.{kind}" for kind in ("cpu", "cuda")]
RAY_PIN = "ray[default]==2.60.0"

Resources = dict[str, float]
Manifest = dict[str, dict[str, Any]]  # the k8s documents by kind


@pytest.fixture(scope="module")
def config() -> DeployConfig:
    return load_config(CONFIG)


@pytest.fixture(scope="module")
def k8s() -> Manifest:
    docs = [doc for doc in yaml.safe_load_all(RAYJOB.read_text()) if doc]
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), "one document per kind expected"
    return by_kind


@pytest.fixture(scope="module")
def launcher() -> dict[str, Any]:
    return yaml.safe_load(LAUNCHER.read_text())


def roles(config: DeployConfig) -> dict[str, RoleConfig]:
    return {name: role for name in ROLES if (role := config.role(name)) is not None}


def quantity(value: str | int | float) -> float:
    """A Kubernetes CPU quantity ("6", "500m", 6) in cores."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def ray_resources_param(value: str) -> Resources:
    """rayStartParams' `resources`: JSON in shell double quotes, '"{\\"small_gpu\\": 1}"'."""
    text = value.strip()
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1].replace('\\"', '"')
    return {name: float(amount) for name, amount in json.loads(text).items()}


def container(template: dict[str, Any]) -> dict[str, Any]:
    (only,) = template["spec"]["containers"]
    return only


def group_resources(group: dict[str, Any]) -> Resources:
    """What one pod of a KubeRay group offers Ray: num-cpus (else the CPU limit), num-gpus, custom ones."""
    params = group.get("rayStartParams", {})
    limits = container(group["template"]).get("resources", {}).get("limits", {})
    offered = {"CPU": quantity(params.get("num-cpus", limits.get("cpu", 0))), "GPU": float(params.get("num-gpus", 0))}
    return offered | ray_resources_param(params.get("resources", "{}"))


def fits(offered: Resources, wanted: Resources) -> int:
    """How many replicas asking `wanted` one node offering `offered` holds."""
    # Ray detects a node's accelerator type itself; the GPU groups' nodeSelectors pin the GPU model.
    wanted = {name: amount for name, amount in wanted.items() if not name.startswith("accelerator_type:")}
    return min(math.floor(offered.get(name, 0.0) / amount + 1e-9) for name, amount in wanted.items())


def cluster_spec(k8s: Manifest) -> dict[str, Any]:
    return k8s["RayJob"]["spec"]["rayClusterSpec"]


def test_configmap_holds_cluster_yaml_verbatim(k8s: Manifest) -> None:
    configmap = k8s["ConfigMap"]
    assert configmap["metadata"]["name"] == "specserve-config"
    assert configmap["data"]["cluster.yaml"] == CONFIG.read_text(), "copy deploy/configs/cluster.yaml into it"


def test_rayjob_serves_the_mounted_config(k8s: Manifest) -> None:
    spec = k8s["RayJob"]["spec"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]
    volumes = {v["name"]: v for v in head["spec"]["volumes"]}
    (mount,) = [
        m for m in container(head)["volumeMounts"]
        if volumes[m["name"]].get("configMap", {}).get("name") == k8s["ConfigMap"]["metadata"]["name"]
    ]  # fmt: skip
    entrypoint = spec["entrypoint"].split()
    assert entrypoint[:2] == ["specserve", "serve"]
    assert " --config " + mount["mountPath"].rstrip("/") + "/cluster.yaml" in " " + " ".join(entrypoint)
    assert "--address auto" in " ".join(entrypoint)
    assert spec["shutdownAfterJobFinishes"] is False, "the job is the long-running server"


def test_head_runs_no_replica(k8s: Manifest, launcher: dict[str, Any]) -> None:
    assert cluster_spec(k8s)["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    head_type = launcher["available_node_types"][launcher["head_node_type"]]
    assert head_type["resources"].get("CPU") == 0


def test_worker_groups_hold_each_role(config: DeployConfig, k8s: Manifest) -> None:
    groups = cluster_spec(k8s)["workerGroupSpecs"]
    for name, role in roles(config).items():
        per_pod = {g["groupName"]: fits(group_resources(g), role.ray_resources()) for g in groups}
        assert any(per_pod.values()), f"no worker group offers what a {name} replica asks: {role.ray_resources()}"
        at_start = sum(per_pod[g["groupName"]] * g["replicas"] for g in groups)
        at_most = sum(per_pod[g["groupName"]] * g["maxReplicas"] for g in groups)
        assert at_start >= role.replicas, f"{name}: {role.replicas} replicas, the starting pods hold {at_start}"
        assert at_most >= role.replicas
    for group in groups:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
        holds = [name for name, role in roles(config).items() if fits(group_resources(group), role.ray_resources())]
        assert len(holds) <= 1, f"{group['groupName']} would take replicas of {holds}: pin them with custom resources"


def test_gpu_groups_request_their_gpus_on_gpu_nodes(k8s: Manifest) -> None:
    gpu_groups = [g for g in cluster_spec(k8s)["workerGroupSpecs"] if group_resources(g)["GPU"] > 0]
    assert gpu_groups, "no worker group offers GPUs"
    for group in gpu_groups:
        limits = container(group["template"])["resources"]["limits"]
        assert float(limits["nvidia.com/gpu"]) == group_resources(group)["GPU"], group["groupName"]
        pod = group["template"]["spec"]
        assert pod.get("nodeSelector"), f"{group['groupName']} needs a nodeSelector for its GPU model"
        assert any(t["key"] == "nvidia.com/gpu" for t in pod.get("tolerations", [])), group["groupName"]


def test_one_image_everywhere(k8s: Manifest, launcher: dict[str, Any]) -> None:
    spec = cluster_spec(k8s)
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    images = {c["image"] for t in templates for c in t["spec"]["containers"]}
    assert images == {launcher["docker"]["image"]}


def test_service_reaches_the_orchestrator(config: DeployConfig, k8s: Manifest) -> None:
    service, head = k8s["Service"]["spec"], cluster_spec(k8s)["headGroupSpec"]["template"]
    assert service["type"] == "ClusterIP", "the API is plaintext and unauthenticated: keep it inside the cluster"
    assert config.orchestrator.host == "0.0.0.0", "the orchestrator must listen beyond the head pod's loopback"
    ports = {p["name"]: p for p in service["ports"]}
    assert set(ports) == {"grpc", "http"}
    for name, wanted in (("grpc", config.orchestrator.port), ("http", config.orchestrator.http_port)):
        assert ports[name]["port"] == wanted, name
        target = ports[name].get("targetPort", wanted)
        (served,) = [p for p in container(head)["ports"] if target in (p["containerPort"], p.get("name"))]
        assert served["containerPort"] == wanted, name
    assert service["selector"].items() <= head["metadata"]["labels"].items()


def test_launcher_node_types_hold_each_role(config: DeployConfig, launcher: dict[str, Any]) -> None:
    node_types = {n: t for n, t in launcher["available_node_types"].items() if n != launcher["head_node_type"]}
    for name, role in roles(config).items():
        per_node = {n: fits(t["resources"], role.ray_resources()) for n, t in node_types.items()}
        at_start = sum(per_node[n] * t.get("min_workers", 0) for n, t in node_types.items())
        assert at_start >= role.replicas, f"{name}: {role.replicas} replicas, the first nodes hold {at_start}"
    for node_name, node_type in node_types.items():
        holds = [name for name, role in roles(config).items() if fits(node_type["resources"], role.ray_resources())]
        assert len(holds) <= 1, f"{node_name} would take replicas of {holds}"


def test_launcher_command_serves_the_config_in_the_image() -> None:
    lines = LAUNCHER.read_text().splitlines()
    (command,) = [line for line in lines if "ray exec" in line and "specserve serve" in line]
    assert "--address auto" in command
    path = re.search(r"--config (\S+)", command)
    assert path is not None and path.group(1).startswith("/app/"), "the image copies the repository to /app"
    assert (ROOT / path.group(1).removeprefix("/app/")).read_text() == CONFIG.read_text()


def instructions(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = dockerfile.read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_installs_the_project(dockerfile: Path, config: DeployConfig, k8s: Manifest) -> None:
    lines = instructions(dockerfile)
    runs = [line for line in lines if line.startswith("RUN ")]
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(d.split()[0] for d in dependencies if d.startswith("torch=="))
    ray_pins = [d.split()[0] for d in dependencies if re.match(r"ray(\[.*\])?==", d)]
    assert any(re.fullmatch(r"COPY .*\. /app", line) for line in lines), "the launcher serves /app/deploy/configs"
    assert any(re.search(r"pip install \. " + re.escape(f'"{RAY_PIN}"'), run) for run in runs)
    assert RAY_PIN.endswith("==" + cluster_spec(k8s)["rayVersion"])
    assert all(pin.split("==")[1] == RAY_PIN.split("==")[1] for pin in ray_pins), "pyproject pins another Ray"
    assert any(f'pip install "{torch_pin}"' in run for run in runs)
    assert f"EXPOSE {config.orchestrator.port} {config.orchestrator.http_port}" in lines
    assert any("apt-get install" in run and " wget " in run for run in runs), "KubeRay's probes run wget"
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
