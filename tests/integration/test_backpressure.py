"""Backpressure on the served stack: past max_concurrent_requests requests queue; past the queue (or its
timeout) they get RESOURCE_EXHAUSTED with a retry hint, and a freed slot serves the next one correctly."""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import pytest

from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve_client import SpecServeClient, build_request
from tests.faults import Delay
from tests.stack import LocalStack


def _retry_after_ms(error: grpc.RpcError) -> int:
    metadata = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
    return int(metadata["retry-after-ms"])


def test_requests_past_the_limit_queue_then_are_refused_with_a_retry_hint(engine: SpeculativeEngine) -> None:
    slow = Delay("Verify", seconds=0.1)  # every target call, a token each: a long request holds its slot for seconds
    overrides = {"max_concurrent_requests": 1, "max_queued_requests": 1, "queue_timeout_s": 1.0}
    overrides["target_only_run_tokens"] = 1
    with (
        LocalStack(draft=None, orchestrator=overrides, interceptors={"target": [slow]}) as stack,
        SpecServeClient(stack.address, timeout_s=60) as client,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        holder = pb_grpc.OrchestratorStub(client.channel).GenerateStream(
            build_request("def f(", max_tokens=300, ignore_eos=True), timeout=60
        )
        next(holder)  # admitted and decoding: the one slot is taken
        queued = pool.submit(client.generate, "x = ", max_tokens=4)
        time.sleep(0.3)  # it is waiting in the queue now
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:  # the queue is full too: refused at once
            client.generate("y = ", max_tokens=4)
        assert time.monotonic() - started < 0.5
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry in" in refused.value.details() and "max_concurrent_requests 1" in refused.value.details()
        assert _retry_after_ms(refused.value) > 0

        with pytest.raises(grpc.RpcError) as timed_out:  # the queued one waited its second, then gave up
            queued.result(10)
        assert timed_out.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue timeout" in timed_out.value.details() and _retry_after_ms(timed_out.value) > 0

        waiting = pool.submit(client.generate, "x = ", max_tokens=4, ignore_eos=True)
        time.sleep(0.3)
        holder.cancel()  # the slot frees: the queued request runs, correctly
        expected = engine.generate(
            GenerationRequest(prompt="x = ", max_tokens=4, num_speculative_tokens=0, ignore_eos=True)
        ).token_ids
        assert list(waiting.result(30).token_ids) == expected
        assert client.generate("x = ", max_tokens=4, ignore_eos=True).token_ids == expected  # and the next
