"""`python -m orchestrator --target HOST:PORT [--draft HOST:PORT] ...`: the orchestrator over hand-started
workers (fixed addresses, no Ray). SIGTERM or SIGINT: refuse new requests, drain those in flight, exit 0."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys

from orchestrator.replicas import StaticFleet
from orchestrator.server import serve
from orchestrator.service import OrchestratorConfig
from specserve.flags import add_config_flags, build_from_flags
from specserve.logs import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator", description=__doc__)
    parser.add_argument("--target", action="append", required=True, metavar="HOST:PORT", help="repeatable")
    parser.add_argument(
        "--draft", action="append", default=[], metavar="HOST:PORT", help="repeatable; none: target-only"
    )
    parser.add_argument("--ready-timeout-s", type=float, default=900.0, help="wait this long for the workers")
    parser.add_argument("--tls-dir", metavar="DIR", help="certificates from `specserve certs`: TLS for the API, "
                        "mutual TLS to the workers (start them with --tls-cert/--tls-key/--tls-ca)")  # fmt: skip
    parser.add_argument("--api-key-file", metavar="FILE", help="bearer token the API requires (or SPECSERVE_API_KEY)")
    parser.add_argument("--no-http", action="store_true", help="serve gRPC only (no --http-port)")
    add_config_flags(parser.add_argument_group("orchestrator (OrchestratorConfig)"), OrchestratorConfig)
    return parser


def _secured(config: OrchestratorConfig, tls_dir: str | None, api_key_file: str | None) -> OrchestratorConfig:
    from specserve.security import TLSConfig, read_api_key

    if tls_dir:
        public = TLSConfig.from_dir(tls_dir, "orchestrator-public")
        client = TLSConfig.from_dir(tls_dir, "orchestrator-client")
        client.channel_credentials()  # reads every file now: a bad path fails before anything starts
        config = dataclasses.replace(config, tls=public, worker_tls=client)
    return dataclasses.replace(config, api_key=read_api_key(api_key_file))


async def _serve(config: OrchestratorConfig, fleet: StaticFleet, ready_timeout_s: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(config, fleet, stop=stop, ready_timeout_s=ready_timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(logging.INFO)  # request ids on every line; JSON when SPECSERVE_LOG_FORMAT=json
    try:
        config = build_from_flags(OrchestratorConfig, args)
        config = _secured(config, args.tls_dir, args.api_key_file)
        if args.no_http:
            config = dataclasses.replace(config, http_port=None)
    except ValueError as error:
        print(f"orchestrator: error: {error}", file=sys.stderr)
        return 2
    fleet = StaticFleet({"target": args.target, "draft": args.draft})
    asyncio.run(_serve(config, fleet, args.ready_timeout_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
