"""`specserve serve` flags -> the deploy config: what k means (fixed or adaptive, and its bound), vLLM's
spellings, and the banner's words for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.config import DeployConfig
from orchestrator.config import OrchestratorConfig
from specserve.cli import _deploy_config, build_parser


def serve_config(*argv: str) -> DeployConfig:
    return _deploy_config(build_parser().parse_args(["serve", *argv]))


def k_settings(config: DeployConfig) -> tuple[bool, int, int]:
    o = config.orchestrator
    return o.adaptive, o.num_speculative_tokens, o.max_adaptive_k


def test_default_is_adaptive_up_to_8() -> None:
    config = serve_config()
    assert k_settings(config) == (True, 4, 8)
    assert config.orchestrator.describe_k(has_draft=True) == "adaptive 0..8 (seeded samples: fixed 4)"


@pytest.mark.parametrize("flag", ["-k", "--num-speculative-tokens"])
def test_a_k_given_is_fixed(flag: str) -> None:
    config = serve_config(flag, "5")
    assert k_settings(config) == (False, 5, 8)
    assert config.orchestrator.describe_k(has_draft=True) == "fixed 5"


def test_adaptive_flags() -> None:
    assert k_settings(serve_config("--max-speculative-tokens", "12")) == (True, 4, 12)
    assert k_settings(serve_config("--no-adaptive")) == (False, 4, 8)
    assert k_settings(serve_config("--adaptive", "-k", "3")) == (True, 3, 8)  # 3: seeded samples' k
    assert serve_config("-k", "0").orchestrator.describe_k(has_draft=True) == "fixed 0 (target-only)"
    assert OrchestratorConfig().describe_k(has_draft=False) == "0 (no draft)"
    with pytest.raises(ValueError, match="max_adaptive_k must be in"):
        serve_config("--max-speculative-tokens", "0")


def test_vllm_spellings() -> None:
    config = serve_config("--model", "tiny", "--speculative-model", "tiny-draft", "--num-speculative-tokens", "5")
    assert (config.target.model.name, config.draft and config.draft.model.name) == ("tiny", "tiny-draft")
    assert k_settings(config) == (False, 5, 8)
    args = build_parser().parse_args(["generate", "--speculative-model", "tiny-draft", "--num-speculative-tokens",
                                      "2", "hi"])  # fmt: skip
    assert (args.draft, args.num_speculative_tokens) == ("tiny-draft", 2)


def test_a_config_file_keeps_its_k_unless_a_flag_says(tmp_path: Path) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text("[orchestrator]\nadaptive = false\nnum_speculative_tokens = 6\n")
    assert k_settings(serve_config("--config", str(path))) == (False, 6, 8)
    assert k_settings(serve_config("--config", str(path), "--adaptive")) == (True, 6, 8)


def test_stray_arguments_get_the_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from specserve.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--foo"])
    err = capsys.readouterr().err
    assert err.startswith("usage: specserve serve") and "specserve serve: error: unrecognized arguments: --foo" in err
    with pytest.raises(SystemExit):
        main(["models"])
    assert "required: action\n" in capsys.readouterr().err  # names are optional


def test_generate_flags_and_every_flag_has_help() -> None:
    args = build_parser().parse_args(["generate", "--ignore-eos", "hi"])
    assert args.ignore_eos and args.prompt == "hi"
    for argv in (
        ["generate", "hi"],
        ["serve"],
        ["bench", "latency"],
        ["bench", "load", "--concurrency", "1"],
        ["bench", "rate", "--request-rate", "1"],
        ["models", "list"],
        ["scale", "--address", "x:1"],
    ):
        command = build_parser().parse_args(argv).command_parser
        assert [a.dest for a in command._actions if not a.help] == [], argv


def test_replica_lines_count_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    from protos import specserve_pb2 as pb
    from specserve.cli import _print_replicas

    replicas = [pb.ReplicaInfo(role="target", address="a:1", state="serving", active_sessions=n) for n in (1, 2)]
    _print_replicas(pb.ReplicaSet(replicas=replicas, desired_target_replicas=2))
    out = capsys.readouterr().out
    assert " 1 session\n" in out and " 2 sessions\n" in out


def test_each_serve_flag_lands_on_its_field() -> None:
    config = serve_config("--address", "auto", "--target-num-gpus", "1", "--draft-replicas", "2", "--draft-dtype",
                          "float32", "--trust-remote-code", "--no-pipeline", "--draft-timeout-s", "2", "--http-port",
                          "0", "--tls-dir", "certs", "--api-key-file", "key")  # fmt: skip
    assert config.ray.address == "auto" and config.target.num_gpus == 1
    assert config.draft is not None and config.draft.replicas == 2 and config.draft.model.dtype == "float32"
    assert config.target.model.trust_remote_code and config.draft.model.trust_remote_code
    assert (config.orchestrator.pipelined, config.orchestrator.draft_timeout_s, config.orchestrator.http_port) == (
        False, 2.0, 0)  # fmt: skip
    assert (config.security.tls_dir, config.security.api_key_file) == ("certs", "key")
    assert serve_config() == DeployConfig()  # no flag given: the dataclasses' defaults, nothing else


def test_bench_subcommands_build_their_configs() -> None:
    from specserve.bench.command import LOAD_FLAGS, RATE_FLAGS, SWEEP_FLAGS
    from specserve.bench.config import BenchConfig, SweepConfig
    from specserve.flags import build_from_flags

    args = build_parser().parse_args(["bench", "latency", "--model", "tiny", "--ks", "4", "--no-hf", "--early-stop",
                                      "0.3", "--served", "--no-in-process", "--category", "edit", "code"])  # fmt: skip
    assert build_from_flags(BenchConfig, args) == BenchConfig(
        target="tiny", ks=(4,), hf=False, stop_threshold=0.3, served=True, in_process=False, categories=("edit", "code")
    )
    args = build_parser().parse_args(["bench", "load", "--concurrency", "1", "4", "--duration", "60", "--warmup",
                                      "30", "--modes", "k=4", "adaptive@ngram", "--drafts", "ngram"])  # fmt: skip
    sweep = build_from_flags(SweepConfig, args, SWEEP_FLAGS + LOAD_FLAGS)
    assert (sweep.concurrency, sweep.duration_s, sweep.warmup_s) == ((1, 4), 60, 30)
    assert sweep.modes == ("k=4", "adaptive@ngram")
    args = build_parser().parse_args(["bench", "rate", "--request-rate", "0.5", "2", "--num-requests", "8"])
    assert build_from_flags(SweepConfig, args, SWEEP_FLAGS + RATE_FLAGS) == SweepConfig(request_rate=(0.5, 2),
                                                                                       num_requests=8)  # fmt: skip
    with pytest.raises(SystemExit):  # a rate sweep has no concurrency
        build_parser().parse_args(["bench", "rate", "--request-rate", "1", "--concurrency", "2"])


@pytest.mark.parametrize(("settings", "message"), [
    ({"concurrency": (1,), "repeats": 0}, "repeats must be >= 1"),
    ({"concurrency": (1,), "modes": ("adaptive@ngram",)}, "drafts ['ngram'] that drafts does not start"),
    ({"concurrency": (1,), "check_ties": True, "temperature": 0.7}, "check_ties compares greedy outputs"),
    ({}, "needs concurrency (closed loop) or request_rate (open loop)"),
])  # fmt: skip
def test_a_bad_sweep_is_refused_by_field(settings: dict, message: str) -> None:
    from specserve.bench.config import SweepConfig

    with pytest.raises(ValueError, match=re.escape(message)):
        SweepConfig(**settings)
