"""`specserve generate | serve | demo | scale | bench | models`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from specserve.bench.command import add_bench_commands
from specserve.flags import add_config_flags, build_from_flags, given_values
from specserve.logs import LOG_FORMAT_ENV, LOG_FORMATS, configure_logging
from specserve.models.config import ModelConfig
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, PRESETS
from specserve.preflight import check_model_name, check_port_free
from specserve.security import API_KEY_ENV, ORCHESTRATOR_NAME, TLSConfig

# No torch, transformers or ray up here: client commands (generate --address, scale, models list, --help)
# start in a fraction of a second; the commands that load models import what they need.
if TYPE_CHECKING:
    from deploy.config import DeployConfig
    from specserve.config import EngineConfig, GenerationRequest, WorkerServiceConfig

LOG_FORMAT_HELP = f"text, or one JSON object per line (default: ${LOG_FORMAT_ENV}, else text)"
DEMO_PROMPT = 'def quicksort(items: list[int]) -> list[int]:\n    """Sort items with quicksort."""\n'
REQUEST_FLAGS = ("max_tokens", "stop", "ignore_eos")
"""GenerationRequest fields `generate` and `demo` take as flags (the sampling ones come from SamplingParams)."""
ROLE_MODEL_FLAGS = ("dtype", "device", "quantization", "engine", "kv_cache_tokens")
"""ModelConfig fields set per role on the command line (--target-dtype, --draft-dtype, ...)."""
ROLE_FLAGS = ("replicas", "num_gpus", "num_cpus")
"""RoleConfig fields `serve` sets per role (--target-replicas, ...); the rest only a config file sets."""
SPECULATION_FLAGS = ("num_speculative_tokens", "max_adaptive_k", "adaptive")
ORCHESTRATOR_FLAGS = ("host", "port", "http_port", "pipelined", "draft_confidence_threshold", "max_concurrent_requests",
                      "max_queued_requests", "queue_timeout_s", "draft_timeout_s", "shutdown_grace_s")  # fmt: skip
"""OrchestratorConfig fields `serve` sets; the rest only a config file (or `python -m orchestrator`) sets."""


def add_model_flags(parser: argparse.ArgumentParser, k: bool = True) -> None:
    """The target and draft of an in-process engine (and of `bench load | rate`'s served stack): names, then
    ModelConfig's dtype, device and quantization per role; with `k`, the engine's k."""
    g = parser.add_argument_group("models")
    g.add_argument("--target", "--model", default=DEFAULT_TARGET, help="target: preset, HF model id or directory")
    g.add_argument("--draft", "--speculative-model", default=DEFAULT_DRAFT,
                   help="draft: preset, HF model id or directory; 'none' for none; 'ngram': prompt "
                   "lookup, no model; 'MODEL+ngram': the hybrid of both")  # fmt: skip
    for role in ("target", "draft"):
        add_config_flags(g, ModelConfig, only=ROLE_MODEL_FLAGS, prefix=f"{role}-",
                         defaults=ModelConfig.for_role(role, "NAME"))  # fmt: skip
    add_config_flags(g, ModelConfig, only=["trust_remote_code"])
    if k:
        g.add_argument("-k", "--num-speculative-tokens", type=int, metavar="K", help="drafts per round; 0 = target-"
                       "only (default: in process 4; with --address, the server's k, adaptive by default)")  # fmt: skip


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    from specserve.config import EngineConfig

    for name in (args.target, args.draft):
        if name.lower() != "none":
            check_model_name(name)  # before anything loads: a typo is one line, not a hub timeout
    target = role_model(args, "target", args.target)
    draft = None if args.draft.lower() == "none" else role_model(args, "draft", args.draft)
    k = 0 if draft is None else getattr(args, "num_speculative_tokens", None)  # None: EngineConfig's default
    return EngineConfig(target, draft, **({} if k is None else {"num_speculative_tokens": k}))


def role_model(args: argparse.Namespace, role: str, name: str) -> ModelConfig:
    """`name` with the role's defaults and the --ROLE-dtype / -device / -quantization / --trust-remote-code given."""
    base = dataclasses.asdict(ModelConfig.for_role(role, name)) | {"trust_remote_code": bool(args.trust_remote_code)}
    return build_from_flags(ModelConfig, args, ROLE_MODEL_FLAGS, prefix=f"{role}-", **base)  # type: ignore[no-any-return]


def _add_request_flags(parser: argparse.ArgumentParser) -> None:
    from specserve.config import GenerationRequest
    from specserve.core.types import SamplingParams

    g = parser.add_argument_group("request")
    add_config_flags(g, GenerationRequest, only=REQUEST_FLAGS)
    add_config_flags(g, SamplingParams)
    g.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids, stats")
    g.add_argument("--stream", action="store_true", help="print text as it is generated")


def _request(args: argparse.Namespace, prompt: str) -> GenerationRequest:
    from specserve.config import GenerationRequest
    from specserve.core.types import SamplingParams

    return build_from_flags(  # type: ignore[no-any-return]
        GenerationRequest, args, REQUEST_FLAGS,
        prompt=None if args.chat else prompt,
        messages=(("user", prompt),) if args.chat else None,
        sampling=build_from_flags(SamplingParams, args),
        num_speculative_tokens=args.num_speculative_tokens,
    )  # fmt: skip


def cmd_generate(args: argparse.Namespace, prompt: str | None = None) -> int:
    prompt = prompt if prompt is not None else (args.prompt if args.prompt != "-" else sys.stdin.read())
    if args.address:
        return _generate_remote(args, prompt)
    config = _engine_config(args)  # checks the model names before the import below loads torch
    from inprocess.engine import SpeculativeEngine

    engine = SpeculativeEngine.from_config(config)
    for chunk in engine.stream(_request(args, prompt)):
        if args.stream and not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    result = chunk.result
    _print_result(args, result.text, result.token_ids, result.finish_reason or "", result.stats.summary())
    return 0


def _generate_remote(args: argparse.Namespace, prompt: str) -> int:
    from google.protobuf.json_format import MessageToDict

    from orchestrator.generation import generation_request_to_proto
    from specserve_client import SpecServeClient

    request = generation_request_to_proto(_request(args, prompt))
    with SpecServeClient(args.address, **_client_security(args)) as client:
        text, token_ids = [], []
        for chunk in client.stub.GenerateStream(request, timeout=client.timeout_s):
            text.append(chunk.text)
            token_ids.extend(chunk.token_ids)
            if args.stream and not args.json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    stats = MessageToDict(chunk.stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    _print_result(args, "".join(text), token_ids, chunk.finish_reason, stats)
    return 0


def _add_client_security_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("security")
    g.add_argument("--tls-ca", metavar="PEM", help="connect over TLS trusting this CA (DIR/ca.pem of specserve certs)")
    g.add_argument("--api-key", help=f"bearer token of the public API (default: ${API_KEY_ENV})")


def _client_security(args: argparse.Namespace) -> dict[str, object]:
    """SpecServeClient's tls and api_key from --tls-ca / --api-key (or SPECSERVE_API_KEY)."""
    from specserve.security import TLSConfig, api_key_from_env

    tls = TLSConfig(ca=args.tls_ca) if getattr(args, "tls_ca", None) else None
    return {"tls": tls, "api_key": getattr(args, "api_key", None) or api_key_from_env()}


def _print_result(args: argparse.Namespace, text: str, token_ids: list[int], finish_reason: str, stats: dict) -> None:
    if args.json:
        print(json.dumps({"text": text, "token_ids": token_ids, "finish_reason": finish_reason, "stats": stats}))
        return
    print("" if args.stream else text)
    print(
        f"\n[{finish_reason}] {stats['generated_tokens']} tokens in {stats['total_ms'] / 1000:.2f}s = "
        f"{stats['tokens_per_second']:.2f} tok/s, first token after {stats['time_to_first_token_ms']:.0f} ms; "
        f"accepted {stats['accepted']}/{stats['proposed']} drafts ({stats['acceptance_rate']:.0%}), "
        f"{stats['mean_acceptance_length']:.2f} tokens per round over {stats['rounds']} rounds; "
        f"waiting on the draft {stats['draft_ms'] / 1000:.2f}s, on the target {stats['target_ms'] / 1000:.2f}s",
        file=sys.stderr,
    )


def _add_deploy_flags(parser: argparse.ArgumentParser) -> None:
    """Flags for the deploy config's most used settings, each derived from its field; a flag given overrides
    the --config file, which overrides the dataclasses' defaults (deploy/config.py)."""
    from deploy.config import RayConfig, RoleConfig, SecurityConfig
    from orchestrator.config import OrchestratorConfig

    parser.add_argument("--config", metavar="FILE", help="deployment config, YAML or TOML (see deploy/configs/)")
    add_config_flags(parser, RayConfig, only=["address"])
    g = parser.add_argument_group("models (default: the qwen2.5-coder 1.5b target, 0.5b draft)")
    g.add_argument("--target", "--model", help="target: preset, HF model id or directory")
    g.add_argument("--draft", "--speculative-model", help="draft: preset, HF model id or directory; 'none' serves "
                   "target-only; 'ngram': prompt lookup, no model; 'MODEL+ngram': the hybrid of both")  # fmt: skip
    add_config_flags(g, ModelConfig, only=["trust_remote_code"])
    for role in ("target", "draft"):
        g = parser.add_argument_group(f"{role} replicas (each)")
        add_config_flags(g, ModelConfig, only=ROLE_MODEL_FLAGS, prefix=f"{role}-",
                         defaults=ModelConfig.for_role(role, "NAME"))  # fmt: skip
        add_config_flags(g, RoleConfig, only=ROLE_FLAGS, prefix=f"{role}-")
    defaults = OrchestratorConfig()
    k, max_k = defaults.num_speculative_tokens, defaults.max_adaptive_k
    g = parser.add_argument_group("speculation (a request that sets k gets that k)",
                                  f"Default: requests that do not set k get adaptive k, 0..{max_k} drafts per round as "
                                  f"acceptance and costs say; seeded samples keep a fixed {k}. A k given here is "
                                  "fixed: adaptive off unless --adaptive is given too.")  # fmt: skip
    add_config_flags(g, OrchestratorConfig, only=SPECULATION_FLAGS)
    g = parser.add_argument_group("orchestrator")
    add_config_flags(g, OrchestratorConfig, only=ORCHESTRATOR_FLAGS)
    g.add_argument("--no-http", action="store_true", help="serve the gRPC API only (no --http-port)")
    g = parser.add_argument_group("security (default: plaintext, no key; keep such a stack on loopback)")
    add_config_flags(g, SecurityConfig)


def _deploy_config(args: argparse.Namespace, **overrides: object) -> DeployConfig:
    from deploy.config import load_config

    flags: dict[str, object] = {"ray.address": args.address}
    for role in ("target", "draft"):
        name = getattr(args, role)
        if role == "draft" and name is not None and name.lower() == "none":
            continue
        flags |= {f"{role}.model.name": name, f"{role}.model.trust_remote_code": args.trust_remote_code}
        flags |= _dotted(f"{role}.model", given_values(args, ROLE_MODEL_FLAGS, prefix=f"{role}-"))
        flags |= _dotted(role, given_values(args, ROLE_FLAGS, prefix=f"{role}-"))
    orchestrator = given_values(args, SPECULATION_FLAGS + ORCHESTRATOR_FLAGS)
    if "num_speculative_tokens" in orchestrator:  # a k given is the k requests get (vLLM's --num-speculative-tokens)
        orchestrator.setdefault("adaptive", False)
    flags |= _dotted("orchestrator", orchestrator | overrides)
    flags |= _dotted("security", given_values(args, ("tls_dir", "api_key_file")))
    if args.draft is not None and args.draft.lower() == "none":
        flags["draft"] = "none"  # last: it drops the draft section whatever the file said
    config = load_config(args.config, flags)
    if args.no_http:  # None in the flags means "not given", so switching it off goes here
        config = dataclasses.replace(config, orchestrator=dataclasses.replace(config.orchestrator, http_port=None))
    return config


def _dotted(section: str, values: dict[str, object]) -> dict[str, object]:
    return {f"{section}.{name}": value for name, value in values.items()}


def _preflight(config: DeployConfig) -> None:
    """What can fail before Ray starts and models load: names that cannot load, ports in use."""
    local = config.ray.address is None  # joining a cluster, the models load on its nodes
    for role in (config.target, config.draft):
        if role is not None:
            check_model_name(role.model.name, local)
    o = config.orchestrator
    check_port_free(o.host, o.port, "--port")
    check_port_free(o.host, o.http_port, "--http-port")


def cmd_serve(args: argparse.Namespace) -> int:
    config = _deploy_config(args)
    _preflight(config)
    from deploy.serve import serve

    asyncio.run(_serve_until_signalled(serve, config))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The served stack on a local Ray instance, one streamed request through the gRPC client; then a curl
    line for the OpenAI-compatible API, run once, and (unless --once) serving until Ctrl-C."""
    import threading

    from specserve.launcher import free_port

    http_port = {} if args.no_http else {"http_port": args.http_port or free_port()}
    config = _deploy_config(args, port=free_port(), **http_port)
    _preflight(config)
    from deploy.serve import serve

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    listening = threading.Event()
    server = threading.Thread(
        target=loop.run_until_complete, args=(serve(config, lambda _: listening.set(), stop),), daemon=True
    )
    server.start()
    print("starting Ray, the draft and target actors and the orchestrator (loading models)...", file=sys.stderr)
    while not listening.wait(0.5):
        if not server.is_alive():
            print("specserve: error: the served stack failed to start (see the log above)", file=sys.stderr)
            return 1
    args.address, args.stream = f"127.0.0.1:{config.orchestrator.port}", True
    if config.security.tls_dir:
        args.tls_ca = str(Path(config.security.tls_dir) / "ca.pem")
    if config.security.api_key_file and not getattr(args, "api_key", None):
        from specserve.security import read_api_key

        args.api_key = read_api_key(config.security.api_key_file)
    print(f"orchestrator on {args.address}; request:\n", file=sys.stderr)
    print(DEMO_PROMPT, end="")
    try:
        code = _generate_remote(args, DEMO_PROMPT)
        if code != 0 or config.orchestrator.http_port is None:
            return code
        line = _curl_line(config)
        print(f"\nthe OpenAI-compatible API, with curl:\n{line}\n", flush=True)
        if shutil.which("curl"):
            subprocess.run(["bash", "-c", line + " && echo"], timeout=600, check=False)
        if args.once:
            return 0
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the stack like Ctrl-C
        print("serving until Ctrl-C (metrics: " + line.split(" ")[2].replace("/v1/completions", "/metrics") + ")",
              file=sys.stderr, flush=True)  # fmt: skip
        while server.is_alive():
            server.join(0.5)
        return 1  # the stack stopped on its own
    except KeyboardInterrupt:
        return 0
    finally:
        loop.call_soon_threadsafe(stop.set)
        server.join(60)


def _curl_line(config: DeployConfig) -> str:
    """A curl command for the running demo's HTTP API, the key (if any) read where the server read it."""
    o = config.orchestrator
    host = "127.0.0.1" if o.host in ("0.0.0.0", "::", "[::]") else o.host
    scheme, extra = "http", ""
    if config.security.tls_dir:
        scheme, extra = "https", f" --cacert {shlex.quote(str(Path(config.security.tls_dir) / 'ca.pem'))}"
    if o.api_key is not None or config.security.api_key_file:
        key_file = shlex.quote(config.security.api_key_file or "")
        key = f"${API_KEY_ENV}" if os.environ.get(API_KEY_ENV) else f"$(cat {key_file})"
        extra += f' -H "Authorization: Bearer {key}"'
    body = json.dumps({"model": config.target.model.name, "prompt": "def fib(n):", "max_tokens": 48, "temperature": 0})
    return (f"curl -s {scheme}://{host}:{o.http_port}/v1/completions{extra} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(body)}")  # fmt: skip


def cmd_scale(args: argparse.Namespace) -> int:
    """Change (or, with no counts, list) the replicas behind a running orchestrator."""
    from protos import specserve_pb2 as pb
    from protos import specserve_pb2_grpc as pb_grpc
    from specserve.security import client_channel

    with client_channel(args.address, **_client_security(args)) as channel:  # type: ignore[arg-type]
        admin = pb_grpc.AdminStub(channel)
        if args.draft_replicas is None and args.target_replicas is None:
            replica_set = admin.ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set
        else:
            request = pb.ScaleRequest(draft_replicas=args.draft_replicas, target_replicas=args.target_replicas)
            replica_set = admin.Scale(request, timeout=args.timeout).replica_set
        deadline = time.monotonic() + args.timeout
        while args.wait and not _settled(replica_set):
            if time.monotonic() > deadline:
                print(f"specserve: error: replicas not settled after {args.timeout:.0f}s", file=sys.stderr)
                _print_replicas(replica_set)
                return 1
            time.sleep(1.0)
            replica_set = admin.ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set
    _print_replicas(replica_set)
    return 0


def _settled(replica_set: object) -> bool:
    for role in ("draft", "target"):
        serving = [r for r in replica_set.replicas if r.role == role and r.state == "serving"]  # type: ignore[attr-defined]
        if len(serving) != getattr(replica_set, f"desired_{role}_replicas"):
            return False
    return True


def _print_replicas(replica_set: object) -> None:
    for role in ("target", "draft"):
        replicas = [r for r in replica_set.replicas if r.role == role]  # type: ignore[attr-defined]
        desired = getattr(replica_set, f"desired_{role}_replicas")
        print(f"{role}: {desired} wanted, {sum(r.state == 'serving' for r in replicas)} serving")
        for r in replicas:
            if r.state == "given_up":  # died while loading too often; r.address is its name
                print(f"  {r.address:24} {r.state:9} not restarted: {r.detail}")
                continue
            sessions = "session" if r.active_sessions == 1 else "sessions"
            print(f"  {r.address:24} {r.state:9} {r.active_sessions} {sessions}")


def cmd_models(args: argparse.Namespace) -> int:
    from specserve.models.config import default_home

    home = default_home()
    if args.action == "list":
        for preset in PRESETS.values():
            print(f"{preset.name:22} {preset.description}")
        print(f"cache: {home}")
        return 0
    for name in args.names or [DEFAULT_TARGET, DEFAULT_DRAFT]:
        preset = PRESETS.get(name)
        if preset is None or not hasattr(preset.source, "sha256"):
            print(f"{name}: not a downloadable preset (see `specserve models list`)", file=sys.stderr)
            return 2
        from specserve.models.loading import ensure_converted, verify_converted

        directory = ensure_converted(preset, home)
        if args.action == "verify":
            verify_converted(preset, home)
        print(f"{name}: ready in {directory}")
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from specserve.certs import make_certs

    directory = make_certs(args.out, args.host, args.days)
    print(f"wrote a CA and worker / orchestrator certificates to {directory}; serve with --tls-dir {directory}, "
          f"call with --tls-ca {directory / 'ca.pem'}")  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserve", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--log-format", choices=LOG_FORMATS, help=LOG_FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for PROMPT ('-' reads stdin)")
    gen.add_argument("prompt", help="the prompt text ('-' reads it from stdin); with --chat, the user message")
    gen.add_argument("--address", help="a running orchestrator (HOST:PORT); without it, generate in this process")
    _add_client_security_flags(gen)
    add_model_flags(gen)
    _add_request_flags(gen)

    serve = sub.add_parser("serve", help="serve draft and target replicas (Ray actors) and the orchestrator")
    _add_deploy_flags(serve)

    demo = sub.add_parser("demo", help="start the served stack on a local Ray instance, send one code prompt")
    _add_deploy_flags(demo)
    _add_request_flags(demo)
    demo.add_argument("--once", action="store_true", help="stop after the requests instead of serving until Ctrl-C")

    scale = sub.add_parser("scale", help="change or list the replicas behind a running orchestrator")
    scale.add_argument("--address", required=True, help="the orchestrator, HOST:PORT")
    _add_client_security_flags(scale)
    scale.add_argument("--draft-replicas", type=int, help="draft replicas wanted (without counts: list them)")
    scale.add_argument("--target-replicas", type=int, help="target replicas wanted")
    scale.add_argument("--wait", action="store_true", help="return once every wanted replica serves")
    scale.add_argument("--timeout", type=float, default=900.0, help="seconds for the call (and --wait)")

    bench = sub.add_parser("bench", help="throughput: target-only vs speculative vs HF assisted (latency), the "
                           "served stack under load (load, rate)")  # fmt: skip
    add_bench_commands(bench, functools.partial(add_model_flags, k=False))

    certs = sub.add_parser("certs", help="make a local CA and TLS certificates (for tests, docs, small deployments)")
    certs.add_argument("--out", required=True, metavar="DIR", help="folder to write (serve --tls-dir DIR reads it)")
    certs.add_argument("--host", action="append", default=[], help="extra name or IP the servers are reached at")
    certs.add_argument("--days", type=int, default=365, help="validity of the certificates")

    models = sub.add_parser("models", help="list presets; fetch or verify their weights")
    models.add_argument("action", choices=["list", "fetch", "verify"], help="list: the presets; fetch: download, "
                        "verify and convert their weights; verify: hash the converted weights again")  # fmt: skip
    models.add_argument("names", nargs="*", default=[], help="presets to fetch or verify (default: the default "
                        f"target and draft, {DEFAULT_TARGET} and {DEFAULT_DRAFT})")  # fmt: skip
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)  # main() reports stray arguments with its usage
    return parser


def worker_parser(role: str) -> argparse.ArgumentParser:
    """The flags of `python -m draft_service` / `python -m target_service` (launcher.py writes them): one per
    ModelConfig and WorkerServiceConfig field, and the TLS files."""
    from specserve.config import DRAFT_ONLY_SETTINGS, WorkerServiceConfig

    parser = argparse.ArgumentParser(prog=f"python -m {role}_service", description=f"serve a {role} model over gRPC")
    add_config_flags(parser.add_argument_group("model (ModelConfig)"), ModelConfig,
                     defaults=ModelConfig.for_role(role, "NAME"))  # fmt: skip
    skip = DRAFT_ONLY_SETTINGS if role == "target" else ()
    add_config_flags(parser.add_argument_group("server (WorkerServiceConfig)"), WorkerServiceConfig, skip=skip)
    g = parser.add_argument_group("logs and security")
    g.add_argument("--log-format", choices=LOG_FORMATS, help=LOG_FORMAT_HELP)
    g.add_argument("--tls-cert", metavar="PEM", help="serve over TLS with this certificate (and --tls-key)")
    g.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    g.add_argument("--tls-ca", metavar="PEM", help="mutual TLS: answer only the orchestrator's certificate "
                   f"({ORCHESTRATOR_NAME}) signed by this CA")  # fmt: skip
    return parser


def worker_config(role: str, args: argparse.Namespace) -> WorkerServiceConfig:
    """What worker_parser(role) parsed; raises ValueError naming a bad setting."""
    from specserve.config import WorkerServiceConfig

    model = build_from_flags(ModelConfig, args, **dataclasses.asdict(ModelConfig.for_role(role, args.name)))
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        mutual = args.tls_ca is not None
        tls = TLSConfig(args.tls_cert, args.tls_key, args.tls_ca, mutual, (ORCHESTRATOR_NAME,) if mutual else ())
    return build_from_flags(WorkerServiceConfig, args, model=model, tls=tls)  # type: ignore[no-any-return]


def run_worker_service(role: str, serve: Callable[..., Awaitable[None]], argv: list[str] | None = None) -> int:
    """Entry point of `python -m draft_service` / `python -m target_service`."""
    args = worker_parser(role).parse_args(argv)
    _configure_logging(verbose=True, log_format=args.log_format)
    try:
        config = worker_config(role, args)
    except ValueError as error:
        print(f"{role}_service: error: {error}", file=sys.stderr)
        return 2
    if config.cpu_threads is not None or "OMP_NUM_THREADS" not in os.environ:  # else torch already follows it
        import torch

        from specserve.models.loading import cpu_threads

        torch.set_num_threads(cpu_threads(role, config.cpu_threads))
    asyncio.run(_serve_until_signalled(serve, config))
    return 0


async def _serve_until_signalled(serve: Callable[..., Awaitable[None]], config: object) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(config, stop=stop)


def _configure_logging(verbose: bool, log_format: str | None = None) -> None:
    configure_logging(logging.INFO if verbose else logging.WARNING, log_format)
    if log_format:  # processes started from here (a local Ray instance's actors) log the same way
        os.environ[LOG_FORMAT_ENV] = log_format


def _tls_hint(args: argparse.Namespace, error: grpc.RpcError) -> str:
    """Where a connection failed because one side speaks TLS and the other does not, say so."""
    address = getattr(args, "address", None)
    if error.code() != grpc.StatusCode.UNAVAILABLE or not address:  # type: ignore[attr-defined]
        return ""
    from specserve.security import speaks_tls

    tls = speaks_tls(address)
    if tls and not getattr(args, "tls_ca", None):
        return " (this server speaks TLS: pass --tls-ca with the CA of its certificate, DIR/ca.pem of specserve certs)"
    if tls is False and getattr(args, "tls_ca", None):
        return " (this server speaks plaintext, not TLS: leave out --tls-ca)"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would print the top-level usage; the command's own is the useful one
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    _configure_logging(args.verbose or args.command == "serve", args.log_format)  # a server says where it listens
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "demo":
            return cmd_demo(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "scale":
            return cmd_scale(args)
        if args.command == "bench":
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwinds like Ctrl-C: its workers stop too
            from specserve.bench.command import cmd_bench

            return cmd_bench(args, _engine_config)
        if args.command == "certs":
            return cmd_certs(args)
        return cmd_models(args)
    except ValueError as error:  # bad input: say what was wrong, no traceback
        print(f"specserve: error: {error}", file=sys.stderr)
        return 2
    except grpc.RpcError as error:  # a server answered with an error, or none answered
        print(f"specserve: error: {error.code().name}: {error.details()}{_tls_hint(args, error)}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1


if __name__ == "__main__":
    sys.exit(main())
