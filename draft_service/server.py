"""The draft gRPC server: `python -m draft_service --model NAME --port N`, or serve() from code. NAME may be
`ngram` (prompt lookup, no model) or `MODEL+ngram` (the hybrid)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from draft_service.hybrid import HybridConfig, HybridWorker
from draft_service.lookup import LookupConfig, LookupWorker
from draft_service.servicer import DraftServicer
from draft_service.worker import DraftWorker
from protos import specserve_pb2 as pb
from specserve.config import WorkerServiceConfig
from specserve.models.draft_names import parse_draft_name
from specserve.models.loading import load_model
from specserve.worker.serve import Role
from specserve.worker.serve import serve as serve_role

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


DRAFT = Role("draft", SERVICE, DraftServicer, make_draft_worker)


async def serve(config: WorkerServiceConfig, **hooks: Any) -> None:
    """The worker runtime's serve() in the draft role; `hooks` as there (on_listening, stop, ...)."""
    await serve_role(DRAFT, config, **hooks)
