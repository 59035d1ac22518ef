"""Adaptive k through the served stack: when a request's k goes to 0 for some rounds and back, the draft is
sent the tokens of the target-only rounds, so its context always matches the request's."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest

import orchestrator.replicas
from inprocess.engine import SpeculativeEngine
from orchestrator.config import OrchestratorConfig
from specserve.adaptive import AdaptiveConfig, AdaptivePolicy
from specserve.config import GenerationRequest
from specserve_client import SpecServeClient
from tests.stack import LocalStack


class ScriptedPolicy(AdaptivePolicy):
    """The replica's policy deciding `decisions` in turn (from `first_k` until its first decision)."""

    def __init__(self, config: AdaptiveConfig, decisions: Iterator[int], first_k: int) -> None:
        super().__init__(config)
        self.decisions, self.scripted_k = decisions, first_k

    @property
    def k(self) -> int:
        return self.scripted_k

    def choose(self, batch_size: int, now: float) -> int:
        self.scripted_k = next(self.decisions)
        return self.scripted_k


def _policy_script(monkeypatch: pytest.MonkeyPatch, decisions: Iterator[int], first_k: int = 4) -> None:
    """Every replica's policy follows `decisions`."""
    monkeypatch.setattr(
        orchestrator.replicas, "AdaptivePolicy", lambda config: ScriptedPolicy(config, decisions, first_k)
    )


class Recorder(grpc.aio.ServerInterceptor):
    """Keeps a worker's calls of `methods` (by default the draft's Prefill and Propose), with their answers,
    in order, and when each ran (monotonic start and end)."""

    def __init__(self, methods: tuple[str, ...] = ("Prefill", "Propose")) -> None:
        self.methods = methods
        self.calls: list[tuple[str, Any, Any]] = []
        self.spans: list[tuple[str, float, float]] = []

    def spans_of(self, method: str) -> list[tuple[float, float]]:
        return [(start, end) for name, start, end in self.spans if name == method]

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method.rsplit("/", 1)[-1]
        if handler is not None and handler.stream_stream is not None and method.removesuffix("Stream") in self.methods:
            return self._per_message(handler, method.removesuffix("Stream"))  # a session's round calls, as messages
        if handler is not None and handler.stream_stream is not None and method.removesuffix("Rounds") in self.methods:
            return self._per_call(handler, method.removesuffix("Rounds"))  # every session's round calls
        if handler is None or method not in self.methods:
            return handler
        inner = handler.unary_unary

        async def recorded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.monotonic()
            response = await inner(request, context)
            self.calls.append((method, request, response))
            self.spans.append((method, start, time.monotonic()))
            return response

        return grpc.unary_unary_rpc_method_handler(
            recorded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


    def _per_message(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        inner = handler.stream_stream

        async def recorded(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            pending: deque[tuple[Any, float]] = deque()

            async def noted() -> AsyncIterator[Any]:
                async for request in requests:
                    pending.append((request, time.monotonic()))
                    yield request

            async for response in inner(noted(), context):
                request, start = pending.popleft()
                self.calls.append((method, request, response))
                self.spans.append((method, start, time.monotonic()))
                yield response

        return grpc.stream_stream_rpc_method_handler(
            recorded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


    def _per_call(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """Each call of a round stream's messages, kept when its result comes back."""
        inner = handler.stream_stream

        async def recorded(batches: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            pending: dict[int, tuple[Any, float]] = {}

            async def noted() -> AsyncIterator[Any]:
                async for batch in batches:
                    for call in batch.calls:
                        pending[call.call_id] = (call.request, time.monotonic())
                    yield batch

            async for results in inner(noted(), context):
                for result in results.results:
                    if getattr(result, "partial", False):  # a run's token ahead of its result
                        continue
                    request, start = pending.pop(result.call_id)
                    if result.HasField("response"):
                        self.calls.append((method, request, result.response))
                        self.spans.append((method, start, time.monotonic()))
                yield results

        return grpc.stream_stream_rpc_method_handler(
            recorded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


def _served_adaptive(engine: SpeculativeEngine, prompt: str, max_tokens: int) -> tuple[list[int], list[int], Recorder]:
    """`prompt` served with k unset (adaptive, as the test scripted the policy), its output checked against
    target-only's; the prompt's token ids, that output and the draft's recorded calls."""
    recorder = Recorder()
    with LocalStack(interceptors={"draft": [recorder]}) as stack, SpecServeClient(stack.address) as client:
        response = client.generate(prompt, max_tokens=max_tokens, ignore_eos=True)
    request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True)
    reference = engine.generate(request).token_ids
    assert list(response.token_ids) == reference
    return engine.tokenize(request), reference, recorder


def test_the_draft_catches_up_after_target_only_rounds(
    engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _policy_script(monkeypatch, itertools.cycle([3, 0, 0, 0, 2, 0, 4]))
    prompt_ids, reference, recorder = _served_adaptive(engine, "def add(a, b):", max_tokens=160)
    truth = prompt_ids + reference
    draft_context: list[int] = []
    num_checked = 0
    for method, call, answer in recorder.calls:
        if method == "Prefill":
            draft_context = list(call.prompt_token_ids)
            continue
        draft_context = draft_context[: call.num_kept] + list(call.new_token_ids)  # what the draft commits
        if call.new_token_ids:  # a catch-up or a new token: the committed context is the request's
            assert draft_context == truth[: len(draft_context)]
            num_checked += 1
        draft_context += list(answer.token_ids)  # its proposals, checked by the target next
    assert num_checked >= 3


@pytest.mark.parametrize("adaptive", [True, False])
def test_target_only_rounds_decode_in_runs_and_stream_token_by_token(
    engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch, adaptive: bool
) -> None:
    """At k = 0 a call decodes a run of tokens (orchestrator/pipeline.py), each streamed as it comes: runs of
    target_only_run_tokens under adaptive k (the policy held at 0 here), else one run for the request."""
    _policy_script(monkeypatch, itertools.repeat(0), first_k=0)
    recorder = Recorder(methods=("Verify",))
    max_tokens, run_tokens = 40, OrchestratorConfig().target_only_run_tokens
    stack = LocalStack(draft="tiny-draft" if adaptive else None, interceptors={"target": [recorder]})
    with stack, SpecServeClient(stack.address) as client:
        chunks = list(client.stream("def add(a, b):", max_tokens=max_tokens, ignore_eos=True))
    request = GenerationRequest(
        prompt="def add(a, b):", max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True
    )
    assert [t for chunk in chunks for t in chunk.token_ids] == engine.generate(request).token_ids
    assert sum(1 for chunk in chunks if chunk.token_ids) == max_tokens  # one chunk a token
    assert chunks[-1].stats.rounds == max_tokens - 1  # a round a token after the prefill's first
    # the first token comes from the prefill, then runs of up to run_tokens
    runs = [len(answer.token_ids) for _, _, answer in recorder.calls]
    assert runs == ([run_tokens, run_tokens, max_tokens - 1 - 2 * run_tokens] if adaptive else [max_tokens - 1])


def test_a_raised_k_takes_effect_while_predrafts_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window is pre-drafted at the policy's k of the moment, not the running round's: drafted at the
    round's length, a k raised from 1 waited for a rejection that, with every guess right, never came."""
    _policy_script(monkeypatch, itertools.chain([1, 1, 1], itertools.repeat(4)))
    with LocalStack(draft="tiny") as stack, SpecServeClient(stack.address) as client:  # the draft is the target
        stats = client.generate("def add(a, b):", max_tokens=40, ignore_eos=True).stats
    assert stats.draft_hidden_ms > 0  # pre-drafts hit
    assert len(stats.proposed_at_position) == 4 and stats.proposed_at_position[3] >= 4


@pytest.mark.parametrize("later_k", [0, 3])
def test_the_draft_is_prefilled_only_once_a_round_drafts(
    engine: SpeculativeEngine, monkeypatch: pytest.MonkeyPatch, later_k: int
) -> None:
    """With speculation off at the replica when a request starts, the draft's prefill would only take
    hardware from the target's passes: the first round that drafts prefills it with the context so far."""
    _policy_script(monkeypatch, itertools.chain([0, 0, 0], itertools.repeat(later_k)), first_k=0)
    run_tokens = OrchestratorConfig().target_only_run_tokens  # a target-only round decodes a run of them
    prompt_ids, reference, recorder = _served_adaptive(engine, "def add(a, b):", max_tokens=3 * run_tokens + 16)
    if later_k == 0:
        assert recorder.calls == []  # target-only throughout: the draft never hears of the request
        return
    method, first, _ = recorder.calls[0]
    assert method == "Prefill"
    # the prompt, the first token (chosen in the target's prefill) and the three target-only rounds' tokens
    assert len(first.prompt_token_ids) == len(prompt_ids) + 1 + 3 * run_tokens
    assert list(first.prompt_token_ids) == (prompt_ids + reference)[: len(first.prompt_token_ids)]
    assert [method for method, _, _ in recorder.calls].count("Prefill") == 1
    assert any(method == "Propose" and answer.token_ids for method, _, answer in recorder.calls)
