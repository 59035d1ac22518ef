"""Faults injected into the served stack's workers (tests/faults.py interceptors): a slow draft costs a
round its speculation, never a stall; a cancelled or vanished client frees both sessions within a
second; a target error moves the request or ends it UNAVAILABLE, never with a wrong token."""

from __future__ import annotations

import time

import grpc
import pytest

from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve_client import SpecServeClient, build_request
from tests.faults import Delay, Fail
from tests.stack import LocalStack


def _target_only(engine: SpeculativeEngine, prompt: str, max_tokens: int) -> list[int]:
    request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True)
    return engine.generate(request).token_ids


def worker_sessions(address: str) -> int:
    """Sessions (KV caches) the draft or target worker at `address` holds now."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.TargetServiceStub(channel)  # GetModelInfo has the same path shape on both services
        try:
            return stub.GetModelInfo(pb.ModelInfoRequest(), timeout=5).num_sessions
        except grpc.RpcError:
            return pb_grpc.DraftServiceStub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=5).num_sessions


def _replica_states(address: str) -> dict[str, str]:
    with grpc.insecure_channel(address) as channel:
        replicas = pb_grpc.AdminStub(channel).ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set.replicas
    return {r.address: r.state for r in replicas}


def test_a_slow_draft_makes_rounds_go_target_only_without_stalling(engine: SpeculativeEngine) -> None:
    slow = Delay("Propose", seconds=3.0)  # every proposal, far past the 0.3 s the orchestrator waits
    with (
        LocalStack(orchestrator={"draft_timeout_s": 0.3}, interceptors={"draft": [slow]}) as stack,
        SpecServeClient(stack.address) as client,
    ):
        started = time.monotonic()
        response = client.generate("def f(", max_tokens=60, ignore_eos=True, num_speculative_tokens=4)
        seconds = time.monotonic() - started
        assert list(response.token_ids) == _target_only(engine, "def f(", 60)
        assert slow.num_injected >= 1
        # waiting out each proposal would take >= 3 s per round; giving up costs 0.3 s per draft attempt
        assert seconds < 3.0 * slow.num_injected and seconds < 10, (seconds, slow.num_injected)
        assert _replica_states(stack.address)[stack.addresses["draft"]] == "serving"  # slow is not dead
        print(f"\nfigure: slow draft (every Propose +3 s, draft_timeout_s 0.3): 60 tokens in {seconds:.2f}s, "
              f"{slow.num_injected} proposals given up, output identical")  # fmt: skip


def test_a_draft_slow_once_costs_that_request_its_draft_not_the_replica(engine: SpeculativeEngine) -> None:
    slow = Delay("Propose", seconds=2.0, skip=2, times=1)  # the third proposal answers 2 s late
    with (
        LocalStack(orchestrator={"draft_timeout_s": 0.5}, interceptors={"draft": [slow]}) as stack,
        SpecServeClient(stack.address) as client,
    ):
        response = client.generate("class A:", max_tokens=80, ignore_eos=True, num_speculative_tokens=4)
        assert list(response.token_ids) == _target_only(engine, "class A:", 80)
        assert slow.num_injected == 1
        after = client.generate("class A:", max_tokens=80, ignore_eos=True, num_speculative_tokens=4)
        assert after.token_ids == response.token_ids and after.stats.accepted > 0  # the draft serves on


@pytest.mark.parametrize("how", ["cancel", "disconnect"])
def test_a_client_that_leaves_mid_stream_frees_both_sessions_within_a_second(how: str) -> None:
    with LocalStack() as stack:
        workers = [stack.addresses["target"], stack.addresses["draft"]]
        channel = grpc.insecure_channel(stack.address)
        request = build_request("def f(", max_tokens=400, ignore_eos=True, num_speculative_tokens=4)
        call = pb_grpc.OrchestratorStub(channel).GenerateStream(request, timeout=60)
        next(call)
        next(call)  # decoding: both sessions are open
        assert [worker_sessions(a) for a in workers] == [1, 1]
        left = time.monotonic()
        if how == "cancel":
            call.cancel()
        else:
            channel.close()
        while any(worker_sessions(a) for a in workers):
            assert time.monotonic() - left < 1.0, [worker_sessions(a) for a in workers]
            time.sleep(0.02)
        print(f"\nfigure: client {how}: both sessions freed {1000 * (time.monotonic() - left):.0f} ms later")
        channel.close()
        with grpc.insecure_channel(stack.address) as admin_channel:
            replicas = pb_grpc.AdminStub(admin_channel).ListReplicas(pb.ListReplicasRequest(), timeout=10)
        assert all(r.active_sessions == 0 for r in replicas.replica_set.replicas)


def test_a_target_error_mid_request_moves_it_to_the_other_replica(engine: SpeculativeEngine) -> None:
    fail = Fail("Verify", grpc.StatusCode.INTERNAL, skip=3, times=1)  # one instance: the 4th Verify anywhere
    with (
        LocalStack(num_targets=2, interceptors={"target": [fail], "target-1": [fail]}) as stack,
        SpecServeClient(stack.address) as client,
    ):
        started = time.monotonic()
        response = client.generate("def f(", max_tokens=60, ignore_eos=True, num_speculative_tokens=4)
        seconds = time.monotonic() - started
        assert fail.num_injected == 1
        assert list(response.token_ids) == _target_only(engine, "def f(", 60)
        print(f"\nfigure: target INTERNAL on the 4th Verify: moved to the other replica, 60 tokens in {seconds:.2f}s")


def test_a_target_that_keeps_failing_ends_the_request_unavailable_never_wrong(engine: SpeculativeEngine) -> None:
    fail = Fail("Verify", grpc.StatusCode.UNAVAILABLE, skip=3)  # three rounds succeed, then every Verify fails
    with (
        LocalStack(orchestrator={"failover_timeout_s": 2.0}, interceptors={"target": [fail]}) as stack,
        SpecServeClient(stack.address) as client,
    ):
        received: list[int] = []
        failing_since = None
        with pytest.raises(grpc.RpcError) as raised:
            for chunk in client.stream("def f(", max_tokens=60, ignore_eos=True, num_speculative_tokens=4):
                received.extend(chunk.token_ids)
                failing_since = time.monotonic()
        assert failing_since is not None
        print(f"\nfigure: target failing every Verify from the 4th: {len(received)} correct tokens, then "
              f"UNAVAILABLE {time.monotonic() - failing_since:.2f}s later: {raised.value.details()}")  # fmt: skip
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value
        assert received and received == _target_only(engine, "def f(", 60)[: len(received)]
        assert worker_sessions(stack.addresses["target"]) == 0
