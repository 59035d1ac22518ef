"""`specserve generate | serve | demo | scale | bench | models`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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

from specserve.bench.command import add_bench_arguments
from specserve.logs import LOG_FORMAT_ENV, LOG_FORMATS, configure_logging
from specserve.models.config import DTYPE_NAMES, QUANTIZATIONS, ModelConfig
from specserve.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, PRESETS
from specserve.preflight import check_model_name, check_port_free
from specserve.security import API_KEY_ENV, ORCHESTRATOR_NAME, TLSConfig

# No torch, transformers or ray up here: client commands (generate --address, scale, models list, --help)
# start in a fraction of a second; the commands that load models import what they need.
if TYPE_CHECKING:
    from deploy.config import DeployConfig
    from specserve.config import EngineConfig, GenerationRequest

LOG_FORMAT_HELP = f"text, or one JSON object per line (default: ${LOG_FORMAT_ENV}, else text)"
DTYPE_HELP = "auto: bfloat16 on GPUs and CPUs that compute it, else float32 (tiny models: float32)"
DEVICE_HELP = "auto (CUDA when present, else CPU), cpu, cuda or cuda:N"
QUANTIZATION_HELP = "CPU only: int8 / int4 weights; auto: int4 on AVX-512, else int8 for a draft, none on GPUs"
DEMO_PROMPT = 'def quicksort(items: list[int]) -> list[int]:\n    """Sort items with quicksort."""\n'


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("models")
    g.add_argument("--target", "--model", default=DEFAULT_TARGET, help="target: preset, HF model id or directory")
    g.add_argument("--draft", "--speculative-model", default=DEFAULT_DRAFT,
                   help="draft: preset, HF model id or directory; 'none' for none; 'ngram': prompt "
                   "lookup, no model; 'MODEL+ngram': the hybrid of both")  # fmt: skip
    for role in ("target", "draft"):
        g.add_argument(f"--{role}-dtype", default="auto", choices=["auto", *DTYPE_NAMES], help=DTYPE_HELP)
        g.add_argument(f"--{role}-device", default="auto", help=DEVICE_HELP)
    g.add_argument("--draft-quantization", default="auto", choices=QUANTIZATIONS, help=QUANTIZATION_HELP)
    g.add_argument("--trust-remote-code", action="store_true", help="run modelling code shipped with HF models")
    g.add_argument("-k", "--num-speculative-tokens", type=int, metavar="K", help="drafts per round; 0 = target-only "
                   "(default: in process 4; with --address, the server's k, adaptive by default)")  # fmt: skip


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    from specserve.config import EngineConfig

    for name in (args.target, args.draft):
        if name.lower() != "none":
            check_model_name(name)  # before anything loads: a typo is one line, not a hub timeout
    target = ModelConfig(args.target, args.target_device, args.target_dtype, args.trust_remote_code)
    draft = None
    if args.draft.lower() != "none":
        draft = ModelConfig(
            args.draft, args.draft_device, args.draft_dtype, args.trust_remote_code, args.draft_quantization
        )
    k = 4 if args.num_speculative_tokens is None else args.num_speculative_tokens
    return EngineConfig(target, draft, k if draft else 0)


def _add_request_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("request")
    g.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1: off)")
    g.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens (default 0: off)")
    g.add_argument("--seed", type=int, default=None, help="seeded sampling reproduces its output")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids, stats")
    g.add_argument("--stream", action="store_true", help="print text as it is generated")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens (exactly "
                   "--max-tokens, as benchmarks want)")  # fmt: skip


def _request(args: argparse.Namespace, prompt: str) -> GenerationRequest:
    from specserve.config import GenerationRequest
    from specserve.core.types import SamplingParams

    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    return GenerationRequest(
        prompt=None if args.chat else prompt,
        messages=(("user", prompt),) if args.chat else None,
        max_tokens=args.max_tokens,
        sampling=sampling,
        stop=tuple(args.stop),
        num_speculative_tokens=args.num_speculative_tokens,
        ignore_eos=args.ignore_eos,
    )


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
    """Everything a deploy config file holds; a flag given overrides the file (deploy/config.py)."""
    parser.add_argument("--config", metavar="FILE", help="deployment config, YAML or TOML (see deploy/configs/)")
    parser.add_argument(
        "--address", dest="ray_address", metavar="RAY_ADDRESS",
        help="Ray cluster to join: auto, HOST:6379 or ray://HOST:10001 (default: start one on this machine)",
    )  # fmt: skip
    g = parser.add_argument_group("models (default: the qwen2.5-coder 1.5b target, 0.5b draft)")
    g.add_argument("--target", "--model", help="target: preset, HF model id or directory")
    g.add_argument("--draft", "--speculative-model", help="draft: preset, HF model id or directory; 'none' serves "
                   "target-only; 'ngram': prompt lookup, no model; 'MODEL+ngram': the hybrid of both")  # fmt: skip
    for role in ("target", "draft"):
        g.add_argument(f"--{role}-dtype", choices=["auto", *DTYPE_NAMES], help=DTYPE_HELP)
        g.add_argument(f"--{role}-device", help=DEVICE_HELP)
        g.add_argument(f"--{role}-quantization", choices=QUANTIZATIONS, help=QUANTIZATION_HELP)
    g.add_argument("--trust-remote-code", action="store_true", default=None, help="run modelling code from HF models")
    g = parser.add_argument_group("replicas and placement (per replica)")
    for role in ("target", "draft"):
        g.add_argument(f"--{role}-replicas", type=int, help="replicas at start (default 1)")
        g.add_argument(f"--{role}-num-gpus", type=float, help="GPUs per replica; < 1 shares one (default 0)")
        g.add_argument(f"--{role}-num-cpus", type=float, help="CPUs per replica, as Ray counts them (default 1)")
    from orchestrator.config import OrchestratorConfig

    defaults = OrchestratorConfig()
    k, max_k = defaults.num_speculative_tokens, defaults.max_adaptive_k
    g = parser.add_argument_group("speculation (a request that sets k gets that k)",
                                  f"Default: requests that do not set k get adaptive k, 0..{max_k} drafts per round as "
                                  f"acceptance and costs say; seeded samples keep a fixed {k}.")  # fmt: skip
    g.add_argument("-k", "--num-speculative-tokens", type=int, metavar="K", help="fixed k: K drafts per round for "
                   "requests that do not set k (adaptive off unless --adaptive is given); 0 = target-only")  # fmt: skip
    g.add_argument("--max-speculative-tokens", type=int, metavar="K", help=f"adaptive k's bound (default {max_k})")
    g.add_argument("--adaptive", action=argparse.BooleanOptionalAction, help="adaptive k for requests that do not "
                   f"set k (default: on, unless -k is given); --no-adaptive: the fixed k (default {k})")  # fmt: skip
    g = parser.add_argument_group("orchestrator")
    g.add_argument("--host", help="interface of the public API (default 127.0.0.1; 0.0.0.0 opens it)")
    g.add_argument("--port", type=int, help="public API port (default 50051)")
    g.add_argument("--no-pipeline", action="store_true", default=None, help="do not pre-draft during verification")
    g.add_argument("--http-port", type=int, help="OpenAI-compatible HTTP API and /metrics (default 8000; 0: any free)")
    g.add_argument("--no-http", action="store_true", help="serve the gRPC API only")
    g.add_argument("--draft-confidence-threshold", type=float, help="the draft ends a window after a token it gave "
                   "less than this probability (default 0: never)")  # fmt: skip
    g = parser.add_argument_group("security (default: plaintext, no key; keep such a stack on loopback)")
    g.add_argument("--tls-dir", metavar="DIR", help="certificates from `specserve certs`: TLS on every hop, mutual "
                   "TLS to the workers (the same path on every node)")  # fmt: skip
    g.add_argument("--api-key-file", metavar="FILE", help=f"bearer token the public API requires (or ${API_KEY_ENV})")
    g.add_argument("--max-concurrent-requests", type=int, help="requests decoding at once (default 128)")
    g.add_argument("--max-queued-requests", type=int, help="requests waiting beyond those (default 512); "
                   "more are refused RESOURCE_EXHAUSTED with a retry hint")  # fmt: skip
    g.add_argument("--queue-timeout-s", type=float, help="how long a queued request waits (default 30)")
    g.add_argument("--draft-timeout-s", type=float, help="a slower proposal is skipped: target-only round (default 5)")
    g.add_argument("--shutdown-grace-s", type=float, help="on SIGTERM, time in-flight requests get (default 30)")


def _deploy_config(args: argparse.Namespace, **overrides: object) -> DeployConfig:
    from deploy.config import load_config

    flags: dict[str, object] = {"ray.address": args.ray_address}
    for role in ("target", "draft"):
        name = getattr(args, role)
        if role == "draft" and name is not None and name.lower() == "none":
            continue
        flags |= {f"{role}.model.name": name, f"{role}.model.trust_remote_code": args.trust_remote_code}
        for field in ("dtype", "device", "quantization"):
            flags[f"{role}.model.{field}"] = getattr(args, f"{role}_{field}")
        for field in ("replicas", "num_gpus", "num_cpus"):
            flags[f"{role}.{field}"] = getattr(args, f"{role}_{field}")
    adaptive = args.adaptive
    if adaptive is None and args.num_speculative_tokens is not None:
        adaptive = False  # a k given is the k requests get (vLLM's --num-speculative-tokens)
    flags |= {
        "orchestrator.num_speculative_tokens": args.num_speculative_tokens,
        "orchestrator.adaptive": adaptive,
        "orchestrator.max_adaptive_k": args.max_speculative_tokens,
        "orchestrator.host": args.host,
        "orchestrator.port": args.port,
        "orchestrator.pipelined": False if args.no_pipeline else None,
        "orchestrator.draft_confidence_threshold": args.draft_confidence_threshold,
        "security.tls_dir": args.tls_dir,
        "security.api_key_file": args.api_key_file,
    }
    for name in ("max_concurrent_requests", "max_queued_requests", "queue_timeout_s", "draft_timeout_s",
                 "shutdown_grace_s"):  # fmt: skip
        flags[f"orchestrator.{name}"] = getattr(args, name)
    flags["orchestrator.http_port"] = args.http_port
    flags |= {f"orchestrator.{name}": value for name, value in overrides.items()}
    if args.draft is not None and args.draft.lower() == "none":
        flags["draft"] = "none"  # last: it drops the draft section whatever the file said
    config = load_config(args.config, flags)
    if args.no_http:  # None in the flags means "not given", so switching it off goes here
        config = dataclasses.replace(config, orchestrator=dataclasses.replace(config.orchestrator, http_port=None))
    return config


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
    _add_model_flags(gen)
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

    bench = sub.add_parser("bench", help="HumanEval throughput: target-only vs speculative vs HF assisted")
    _add_model_flags(bench)
    add_bench_arguments(bench)

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
    """The flags of `python -m draft_service` / `python -m target_service` (launcher.py writes them)."""
    parser = argparse.ArgumentParser(prog=f"python -m {role}_service", description=f"serve a {role} model over gRPC")
    parser.add_argument("--model", required=True, help="preset, HF model id or local directory")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPE_NAMES])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quantization", default="auto" if role == "draft" else "none", choices=QUANTIZATIONS)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument(
        "--no-pack-weights", action="store_true", help="CPU bfloat16: keep Linear weights as loaded (not prepacked)"
    )
    parser.add_argument(
        "--no-few-query-attention",
        action="store_true",
        help="CPU: attention as transformers calls it (no packed query heads)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface; 0.0.0.0 opens it to the network")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--max-sessions", type=int, default=256)
    parser.add_argument("--idle-ttl-s", type=float, default=300.0)
    parser.add_argument("--max-batch-size", type=int, default=16, help="sessions per forward pass at most")
    parser.add_argument(
        "--prefill-chunk-tokens", type=int, default=256, help="prompt tokens per prefill pass (others' passes between)"
    )
    if role == "draft":
        parser.add_argument("--draft-slots", type=int, default=64, help="on CUDA: sessions in the preallocated "
                            "KV pool, stepped by CUDA graphs (0: none)")  # fmt: skip
        parser.add_argument("--draft-slot-tokens", type=int, default=4096, help="on CUDA: context of one slot")
    parser.add_argument("--cpu-threads", type=int, help="torch threads on CPU (default: OMP_NUM_THREADS if set, "
                        "else all cores for a target, a quarter for a draft)")  # fmt: skip
    parser.add_argument("--log-format", choices=LOG_FORMATS, help=LOG_FORMAT_HELP)
    parser.add_argument("--tls-cert", metavar="PEM", help="serve over TLS with this certificate (and --tls-key)")
    parser.add_argument("--tls-key", metavar="PEM")
    parser.add_argument("--tls-ca", metavar="PEM", help="mutual TLS: answer only the orchestrator's certificate "
                        f"({ORCHESTRATOR_NAME}) signed by this CA")  # fmt: skip
    return parser


def worker_model(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(args.model, args.device, args.dtype, args.trust_remote_code, args.quantization,
                       few_query_attention=not args.no_few_query_attention,
                       pack_weights=not args.no_pack_weights)  # fmt: skip


def run_worker_service(role: str, serve: Callable[..., Awaitable[None]], argv: list[str] | None = None) -> int:
    """Entry point of `python -m draft_service` / `python -m target_service`."""
    args = worker_parser(role).parse_args(argv)
    _configure_logging(verbose=True, log_format=args.log_format)
    try:
        model = worker_model(args)
        tls = None
        if args.tls_cert or args.tls_key or args.tls_ca:
            mutual = args.tls_ca is not None
            peers = (ORCHESTRATOR_NAME,) if mutual else ()
            tls = TLSConfig(args.tls_cert, args.tls_key, args.tls_ca, mutual, peers)
        slots: dict[str, int] = {}
        if role == "draft":
            slots = {"draft_slots": args.draft_slots, "draft_slot_tokens": args.draft_slot_tokens}
        from specserve.config import WorkerServiceConfig

        config = WorkerServiceConfig(
            model, args.host, args.port, args.max_sessions, args.idle_ttl_s, args.max_batch_size, tls,
            prefill_chunk_tokens=args.prefill_chunk_tokens, **slots,
        )  # fmt: skip
        if args.cpu_threads is not None and args.cpu_threads < 1:
            raise ValueError(f"--cpu-threads must be >= 1, got {args.cpu_threads}")
    except ValueError as error:
        print(f"{role}_service: error: {error}", file=sys.stderr)
        return 2
    if args.cpu_threads is not None or "OMP_NUM_THREADS" not in os.environ:  # else torch already follows it
        import torch

        from specserve.models.loading import cpu_threads

        torch.set_num_threads(cpu_threads(role, args.cpu_threads))
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

            return cmd_bench(args, _engine_config(args))
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
