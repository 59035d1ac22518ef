"""The draft gRPC server: `python -m draft_service --model NAME --port N`, or serve() from code. NAME may be
`ngram` (prompt lookup, no model) or `MODEL+ngram` (the hybrid)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

import grpc

from draft_service.hybrid import HybridConfig, HybridWorker
from draft_service.lookup import LookupConfig, LookupWorker
from draft_service.servicer import DraftServicer
from draft_service.worker import DraftWorker
from protos import specserve_pb2 as pb
from specserve.config import WorkerServiceConfig
from specserve.models.draft_names import parse_draft_name
from specserve.models.loading import load_model
from specserve.rpc import serve_worker

SERVICE = pb.DESCRIPTOR.services_by_name["DraftService"]


def make_draft_worker(config: WorkerServiceConfig) -> DraftWorker | LookupWorker:
    """The model draft, prompt lookup (`ngram`: nothing loaded) or their hybrid (`MODEL+ngram`)."""
    model_name, lookup = parse_draft_name(config.model.name)
    ngrams = LookupConfig(config.prompt_lookup_max, config.prompt_lookup_min)
    if model_name is None:
        return LookupWorker(config.max_sessions, config.idle_ttl_s, ngrams)
    loaded = load_model(replace(config.model, name=model_name))
    if lookup:
        loaded = replace(loaded, name=config.model.name)  # the name the orchestrator sees and compares
        min_match = min(max(HybridConfig().min_match, ngrams.min_ngram), ngrams.max_ngram)
        hybrid = HybridConfig(ngrams, min_match=min_match)
        return HybridWorker(loaded, config.max_sessions, config.idle_ttl_s, config.slot_cache(), hybrid)
    return DraftWorker(loaded, config.max_sessions, config.idle_ttl_s, config.slot_cache())


async def serve(
    config: WorkerServiceConfig,
    on_listening: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    on_serving: Callable[[], None] | None = None,
) -> None:
    def make_worker() -> DraftWorker | LookupWorker:
        return make_draft_worker(config)

    await serve_worker(
        DraftServicer(config.max_batch_size, config.prefill_chunk_tokens),
        SERVICE,
        make_worker,
        config.host,
        config.port,
        on_listening,
        stop,
        interceptors=interceptors,
        tls=config.tls,
        on_serving=on_serving,
    )
