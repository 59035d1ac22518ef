"""The worker command the launcher writes carries every ModelConfig field the worker's flags can hold."""

from __future__ import annotations

import pytest

from specserve.cli import worker_config, worker_parser
from specserve.launcher import _worker_command
from specserve.models.loading import ModelConfig

VARIANTS = [
    ModelConfig("tiny"),
    ModelConfig("some/model", device="cpu", dtype="bfloat16", trust_remote_code=True, quantization="int4"),
    ModelConfig("tiny", few_query_attention=False),
    ModelConfig("tiny", pack_weights=False, few_query_attention=False, quantization="int8"),
]


@pytest.mark.parametrize("model", VARIANTS, ids=range(len(VARIANTS)))
@pytest.mark.parametrize("role", ["draft", "target"])
def test_a_launched_worker_loads_the_model_config_it_was_given(role: str, model: ModelConfig) -> None:
    command = _worker_command(role, model, 50061)
    assert command[1:3] == ["-m", f"{role}_service"]
    config = worker_config(role, worker_parser(role).parse_args(command[3:]))
    assert config.model == model and config.port == 50061


@pytest.mark.parametrize(("role", "quantization"), [("draft", "auto"), ("target", "none")])
def test_a_worker_without_settings_gets_its_roles_defaults(role: str, quantization: str) -> None:
    from specserve.config import WorkerServiceConfig

    config = worker_config(role, worker_parser(role).parse_args(["--model", "tiny"]))
    assert config == WorkerServiceConfig(ModelConfig("tiny", quantization=quantization))
    argv = ["--model", "tiny", "--max-sessions", "3", "--cpu-threads", "2", "--tls-cert", "c", "--tls-key", "k"]
    config = worker_config(role, worker_parser(role).parse_args(argv))
    assert (config.max_sessions, config.cpu_threads, config.tls and config.tls.cert) == (3, 2, "c")
    with pytest.raises(ValueError, match="cpu_threads must be >= 1"):
        worker_config(role, worker_parser(role).parse_args(["--model", "tiny", "--cpu-threads", "0"]))


def test_the_draft_slot_pool_is_on_for_cuda_drafts_unless_turned_off() -> None:
    import torch

    from specserve.config import WorkerServiceConfig

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert WorkerServiceConfig(ModelConfig("tiny")).slot_cache().active_on(cuda)
    assert not WorkerServiceConfig(ModelConfig("tiny")).slot_cache().active_on(cpu)
    args = worker_parser("draft").parse_args(["--model", "tiny", "--draft-slots", "0", "--draft-slot-tokens", "512"])
    assert (args.draft_slots, args.draft_slot_tokens) == (0, 512)
    assert not WorkerServiceConfig(ModelConfig("tiny"), draft_slots=args.draft_slots).slot_cache().active_on(cuda)
    pool = WorkerServiceConfig(ModelConfig("tiny"), draft_slots=8, draft_slot_tokens=512).slot_cache()
    assert (pool.slots, pool.tokens_per_slot) == (8, 512)
    with pytest.raises(SystemExit):  # a target has no draft pool
        worker_parser("target").parse_args(["--model", "tiny", "--draft-slots", "8"])
    with pytest.raises(ValueError, match="draft_slots"):
        WorkerServiceConfig(ModelConfig("tiny"), draft_slots=-1)
