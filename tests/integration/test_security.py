"""Security of the served stack: TLS on every hop, mutual TLS to the workers (only the orchestrator may
call them), the bearer token on the public API, loopback by default, and clear errors for bad TLS files."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.certs import make_certs
from specserve.security import SecurityConfigError, TLSConfig, client_channel
from specserve_client import SpecServeClient
from tests.stack import LocalStack

API_KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stack(certs: Path) -> LocalStack:
    with LocalStack(certs=certs, api_key=API_KEY) as running:
        yield running


def client_tls(certs: Path) -> TLSConfig:
    return TLSConfig.from_dir(certs, "client")


def test_generate_over_tls_with_the_key(stack: LocalStack, certs: Path) -> None:
    with SpecServeClient(stack.address, timeout_s=60, tls=client_tls(certs), api_key=API_KEY) as client:
        response = client.generate("def f(", max_tokens=8, num_speculative_tokens=2)
        assert len(response.token_ids) == 8 and response.stats.proposed > 0  # the draft answered over mTLS
        chunks = list(client.stream("def f(", max_tokens=8))
        assert [t for c in chunks for t in c.token_ids] == list(response.token_ids)
        assert client.info().target_model == "tiny"


@pytest.mark.parametrize("key", [None, "wrong-key", API_KEY + "x", ""])
def test_missing_or_wrong_key_is_unauthenticated(stack: LocalStack, certs: Path, key: str | None) -> None:
    with SpecServeClient(stack.address, timeout_s=30, tls=client_tls(certs), api_key=key) as client:
        for call in (
            lambda: client.generate("x", max_tokens=2),
            lambda: list(client.stream("x", max_tokens=2)),
            client.info,
            lambda: pb_grpc.AdminStub(client.channel).ListReplicas(pb.ListReplicasRequest(), timeout=10),
            lambda: pb_grpc.AdminStub(client.channel).Scale(pb.ScaleRequest(target_replicas=5), timeout=10),
        ):
            with pytest.raises(grpc.RpcError) as raised:
                call()
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, raised.value


def test_health_needs_no_key(stack: LocalStack, certs: Path) -> None:
    with client_channel(stack.address, client_tls(certs)) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_callers_are_refused(stack: LocalStack) -> None:
    for name in ("orchestrator", "target", "draft"):
        with grpc.insecure_channel(stack.addresses[name]) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, (name, raised.value)


def test_the_cli_says_which_side_speaks_tls(
    stack: LocalStack, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specserve.cli import main
    from specserve.security import speaks_tls

    assert (speaks_tls(stack.address), speaks_tls(stack.addresses["target"])) == (True, True)  # mTLS too
    assert main(["generate", "--address", stack.address, "--api-key", API_KEY, "hi"]) == 1
    assert "UNAVAILABLE" in (err := capsys.readouterr().err) and "this server speaks TLS: pass --tls-ca" in err
    with LocalStack(draft=None) as plain:
        assert speaks_tls(plain.address) is False
        args = ["generate", "--address", plain.address, "--tls-ca", str(certs / "ca.pem"), "hi"]
        assert main(args) == 1
        assert "this server speaks plaintext, not TLS" in capsys.readouterr().err
    assert speaks_tls(plain.address) is None  # stopped: no connection, no hint


def test_an_untrusted_server_certificate_is_refused(stack: LocalStack, tmp_path: Path) -> None:
    other_ca = make_certs(tmp_path / "other")
    with SpecServeClient(stack.address, timeout_s=10, tls=client_tls(other_ca), api_key=API_KEY) as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.info()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def _worker_call(address: str, tls: TLSConfig | None) -> grpc.RpcError:
    with client_channel(address, tls) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            pb_grpc.TargetServiceStub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=5)
        return raised.value


def test_workers_answer_only_the_orchestrator(stack: LocalStack, certs: Path, tmp_path: Path) -> None:
    target = stack.addresses["target"]
    # TLS without a client certificate: the handshake fails
    error = _worker_call(target, TLSConfig(ca=str(certs / "ca.pem"), server_name="specserve-worker"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    # a certificate from another CA: the handshake fails
    other = make_certs(tmp_path / "other")
    foreign = dataclasses.replace(TLSConfig.from_dir(other, "orchestrator-client"), ca=str(certs / "ca.pem"))
    assert _worker_call(target, foreign).code() == grpc.StatusCode.UNAVAILABLE
    # a certificate our CA signed, but not the orchestrator's (a worker's): authenticated, not permitted
    as_worker = TLSConfig(str(certs / "worker.pem"), str(certs / "worker-key.pem"), str(certs / "ca.pem"),
                          server_name="specserve-worker")  # fmt: skip
    error = _worker_call(target, as_worker)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "specserve-orchestrator" in error.details()
    # the orchestrator's certificate: answered
    with client_channel(target, TLSConfig.from_dir(certs, "orchestrator-client")) as channel:
        assert pb_grpc.TargetServiceStub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=5).model == "tiny"


def test_the_key_works_without_tls_too() -> None:
    with LocalStack(draft=None, api_key=API_KEY) as plain:
        with SpecServeClient(plain.address, timeout_s=30, api_key=API_KEY) as client:
            assert len(client.generate("a", max_tokens=3).token_ids) == 3
        with SpecServeClient(plain.address, timeout_s=30) as client, pytest.raises(grpc.RpcError) as raised:
            client.generate("a", max_tokens=3)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_bad_tls_files_are_named(tmp_path: Path, certs: Path) -> None:
    with pytest.raises(SecurityConfigError, match="missing.pem"):
        TLSConfig(str(tmp_path / "missing.pem"), str(certs / "worker-key.pem")).server_credentials()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(SecurityConfigError, match="not PEM"):
        TLSConfig(ca=str(garbage)).channel_credentials()
    with pytest.raises(SecurityConfigError, match="both cert and key"):
        TLSConfig(cert=str(certs / "worker.pem"))
    with pytest.raises(SecurityConfigError, match="needs ca"):
        TLSConfig(str(certs / "worker.pem"), str(certs / "worker-key.pem"), require_client_auth=True)


def test_a_server_with_a_missing_certificate_fails_before_loading(tmp_path: Path) -> None:
    from specserve.config import WorkerServiceConfig
    from specserve.models.loading import ModelConfig
    from target_service.server import serve

    tls = TLSConfig(str(tmp_path / "nope.pem"), str(tmp_path / "nope-key.pem"))
    config = WorkerServiceConfig(ModelConfig("tiny", device="cpu"), tls=tls)
    with pytest.raises(SecurityConfigError, match="nope.pem"):
        asyncio.run(asyncio.wait_for(serve(config), 30))


def test_keys_are_private(certs: Path) -> None:
    for name in ("ca-key.pem", "worker-key.pem", "orchestrator-key.pem"):
        assert (certs / name).stat().st_mode & 0o077 == 0, name


def test_every_server_listens_on_loopback_by_default() -> None:
    from deploy.config import DeployConfig
    from orchestrator.service import OrchestratorConfig
    from specserve.config import WorkerServiceConfig
    from specserve.models.loading import ModelConfig

    assert OrchestratorConfig().host == "127.0.0.1"
    assert WorkerServiceConfig(ModelConfig("tiny")).host == "127.0.0.1"
    assert DeployConfig().orchestrator.host == "127.0.0.1"
    from specserve.cli import build_parser

    serve_args = build_parser().parse_args(["serve"])
    assert serve_args.host is None  # the config's loopback default stands unless --host is given
    for module in ("draft_service.server", "target_service.server", "orchestrator.server"):
        source = inspect.getsource(__import__(module, fromlist=["serve"]))
        assert "0.0.0.0" not in source and "[::]" not in source, module


def test_a_stack_listens_on_loopback_only() -> None:
    with LocalStack(draft=None) as plain:
        for address in plain.addresses.values():
            assert address.startswith("127.0.0.1:"), address


def test_cli_generate_over_tls_with_the_key(
    stack: LocalStack, certs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from specserve.cli import main

    argv = ["generate", "def f(", "--address", stack.address, "--tls-ca", str(certs / "ca.pem"), "--max-tokens", "4"]
    assert main([*argv, "--api-key", API_KEY, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 4
    monkeypatch.setenv("SPECSERVE_API_KEY", API_KEY)  # the one environment variable, read in one place
    assert main([*argv, "--json"]) == 0
    monkeypatch.delenv("SPECSERVE_API_KEY")
    assert main(argv) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    scale = ["scale", "--address", stack.address, "--tls-ca", str(certs / "ca.pem")]
    assert main([*scale, "--api-key", API_KEY]) == 0
    assert "target: 1 wanted, 1 serving" in capsys.readouterr().out
    assert main(scale) == 1


def test_deploy_config_has_one_security_section(certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deploy.config import load_config

    monkeypatch.delenv("SPECSERVE_API_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    path = tmp_path / "deploy.yaml"
    path.write_text(f"draft: none\nsecurity:\n  tls_dir: {certs}\n  api_key_file: {key_file}\n")
    config = load_config(path)
    orchestrator = config.security.apply(config.orchestrator)
    assert orchestrator.api_key == API_KEY and API_KEY not in repr(orchestrator)
    assert orchestrator.tls is not None and not orchestrator.tls.require_client_auth
    assert orchestrator.worker_tls is not None and orchestrator.worker_tls.server_name == "specserve-worker"
    worker = config.target.service("127.0.0.1", config.security.worker_tls())
    assert worker.tls is not None and worker.tls.require_client_auth
    assert worker.tls.allowed_peers == ("specserve-orchestrator",)
    assert load_config(None).security.apply(load_config(None).orchestrator).tls is None  # default: off
    missing = load_config(None, {"security.tls_dir": str(tmp_path / "nowhere")})
    with pytest.raises(SecurityConfigError, match="nowhere"):
        missing.security.apply(missing.orchestrator)
    path.write_text("orchestrator:\n  api_key: plain-text-in-a-config\n")
    with pytest.raises(ValueError, match="security"):
        load_config(path)
