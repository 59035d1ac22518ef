"""The deployment config: files and flags, validation that names the field, what Ray is asked for, and
how a config meant for GPUs runs on a machine without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.config import LOOKUP_NUM_CPUS, RoleConfig, config_from_dict, load_config
from deploy.serve import _demand, _on_this_machine
from specserve.config import WorkerServiceConfig
from specserve.models.loading import ModelConfig

CONFIGS = Path(__file__).parents[2] / "deploy" / "configs"


def test_the_shipped_configs_load() -> None:
    cluster = load_config(CONFIGS / "cluster.yaml")
    assert cluster.ray.address == "auto" and cluster.orchestrator.host == "0.0.0.0"
    assert cluster.target.resources == {"large_gpu": 1} and cluster.draft is not None
    assert cluster.draft.num_gpus == 0.5
    local = load_config(CONFIGS / "local.toml")
    assert local.ray.address is None and local.target.model.name == "qwen2.5-coder-1.5b"
    assert local.draft is not None and local.draft.model.quantization == "auto"


def test_flags_override_the_file_and_none_drops_the_draft() -> None:
    config = load_config(
        CONFIGS / "cluster.yaml",
        {"target.replicas": 5, "target.model.dtype": "float32", "orchestrator.port": 0, "draft.num_gpus": None},
    )
    assert (config.target.replicas, config.target.model.dtype, config.orchestrator.port) == (5, "float32", 0)
    assert config.target.model.name == "Qwen/Qwen2.5-Coder-7B-Instruct"  # untouched fields stay
    assert config.draft is not None and config.draft.num_gpus == 0.5  # None means "not given"
    assert load_config(CONFIGS / "cluster.yaml", {"draft": "none"}).draft is None


def test_a_role_nests_its_worker_settings_and_keeps_the_file_flat() -> None:
    config = config_from_dict({"draft": {"model": "tiny-draft", "max_sessions": 7, "cpu_threads": 2, "replicas": 3}})
    assert config.draft is not None and config.draft.replicas == 3
    assert config.draft.worker == WorkerServiceConfig(ModelConfig("tiny-draft", quantization="auto"), max_sessions=7,
                                                      cpu_threads=2)  # fmt: skip
    service = config.draft.service("10.0.0.1")
    assert (service.host, service.max_sessions, service.cpu_threads) == ("10.0.0.1", 7, 2)
    with pytest.raises(ValueError, match=r"target: unknown key\(s\) \['port'\]"):  # set for each replica at start
        config_from_dict({"target": {"port": 1}})


def test_a_model_name_alone_keeps_the_roles_defaults() -> None:
    config = config_from_dict({"draft": {"model": "some/draft"}, "target": {"model": "some/target"}})
    assert config.draft is not None and config.draft.model == ModelConfig("some/draft", quantization="auto")
    assert config.target.model == ModelConfig("some/target")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"target": {"replica": 2}}, "unknown key(s) ['replica']"),
        ({"orchestrator": {"prot": 1}}, "orchestrator: unknown key(s) ['prot']"),
        ({"target": {"num_gpus": 1.5}}, "num_gpus must be a fraction up to 1 or a whole number"),
        ({"target": {"replicas": 0}}, "target.replicas must be >= 1"),
        ({"draft": {"resources": {"small_gpu": 0}}}, "resources['small_gpu'] must be a positive amount"),
        ({"target": {"model": {"name": "x", "dtype": "float8"}}}, "target.model: dtype must be auto or one of"),
        ({"ray": "auto"}, "ray: expected a mapping"),
        ({"orchestrator": {"discovery_interval_s": 0}}, "discovery_interval_s must be > 0"),
        ({"target": {"max_load_failures": 0}}, "target: max_load_failures must be >= 1, got 0"),
    ],
)
def test_bad_settings_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        config_from_dict(data)
    assert message in str(raised.value)


def test_bad_files_are_refused(tmp_path: Path) -> None:
    for name, text, message in (
        ("c.json", "{}", "must end in .yaml, .yml or .toml"),
        ("c.yaml", "- a\n- b\n", "expected a mapping at the top level"),
    ):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message.replace(".", r"\.")):
            load_config(tmp_path / name)


def test_ray_resources_per_replica() -> None:
    worker = WorkerServiceConfig(ModelConfig("m"))
    role = RoleConfig(worker, num_gpus=0.5, num_cpus=2, resources={"small_gpu": 0.5}, accelerator_type="L4")
    assert role.ray_resources() == {"CPU": 2, "GPU": 0.5, "small_gpu": 0.5, "accelerator_type:L4": 0.001}
    assert RoleConfig(worker, num_cpus=0).ray_resources() == {}


def test_a_lookup_draft_asks_for_no_gpu_and_little_cpu() -> None:
    config = load_config(overrides={"draft.model.name": "ngram"})
    assert config.draft is not None and config.draft.lookup_only
    assert config.draft.ray_resources() == {"CPU": LOOKUP_NUM_CPUS}
    assert load_config(overrides={"draft.model.name": "ngram", "draft.num_cpus": 2}).draft.ray_resources() == {
        "CPU": 2
    }  # what the config says wins
    hybrid = load_config(overrides={"draft.model.name": "tiny-draft+ngram"}).draft
    assert hybrid is not None and not hybrid.lookup_only and hybrid.ray_resources() == {"CPU": 1.0}
    with pytest.raises(ValueError, match="num_gpus"):
        load_config(overrides={"draft.model.name": "ngram", "draft.num_gpus": 0.5})
    with pytest.raises(ValueError, match="target.model.name"):
        load_config(overrides={"target.model.name": "ngram"})
    sizes = load_config(overrides={"draft.model.name": "ngram", "draft.prompt_lookup_min": 1}).draft
    assert sizes is not None and sizes.service("127.0.0.1").prompt_lookup_min == 1
    with pytest.raises(ValueError, match="draft: need 1 <= prompt_lookup_min"):
        load_config(overrides={"draft.model.name": "ngram", "draft.prompt_lookup_min": 5})


def test_a_gpu_config_runs_on_a_machine_without_gpus() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    config = _on_this_machine(load_config(CONFIGS / "cluster.yaml"))
    assert config.ray.worker_host == "127.0.0.1"  # everything on loopback
    assert config.target.num_gpus == 0 and config.draft is not None and config.draft.num_gpus == 0
    assert config.target.resources == {"large_gpu": 1}  # custom resources stay: the local instance offers them
    assert _demand(config) == {"CPU": 2 * 4 + 2 * 2, "large_gpu": 2, "small_gpu": 1}


def test_worker_cpu_threads_default_by_role(monkeypatch: pytest.MonkeyPatch) -> None:
    from specserve.models import loading

    monkeypatch.setattr(loading.os, "cpu_count", lambda: 8)
    assert (loading.cpu_threads("target"), loading.cpu_threads("draft")) == (8, 2)
    monkeypatch.setattr(loading.os, "cpu_count", lambda: 2)
    assert (loading.cpu_threads("target"), loading.cpu_threads("draft")) == (2, 1)
    assert loading.cpu_threads("draft", requested=3) == 3
