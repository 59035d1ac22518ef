"""Several replicas behind one orchestrator (fixed addresses, in this process): sessions spread least-loaded
first, a replica that stops mid-request hands its sessions to another, a replica serving another model is
refused, and the admin API answers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve_client import SpecServeClient
from tests.stack import LocalStack


def _replicas(address: str) -> pb.ReplicaSet:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.AdminStub(channel).ListReplicas(pb.ListReplicasRequest(), timeout=10).replica_set


def _busy(address: str) -> dict[str, int]:
    return {r.address: r.active_sessions for r in _replicas(address).replicas if r.role == "target"}


def _wait_for_targets(address: str, count: int, timeout_s: float = 10.0) -> None:
    """The orchestrator starts with the first replica that serves; discovery admits the others."""
    deadline = time.monotonic() + timeout_s
    while len(_busy(address)) != count:
        assert time.monotonic() < deadline, f"wanted {count} target replicas, have {_busy(address)}"
        time.sleep(0.1)


def _target_only(engine: SpeculativeEngine, prompt: str, max_tokens: int) -> list[int]:
    request = GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0, ignore_eos=True)
    return engine.generate(request).token_ids


def test_sessions_spread_over_replicas_and_move_when_one_stops(engine: SpeculativeEngine) -> None:
    with LocalStack(num_targets=2) as stack, SpecServeClient(stack.address) as client:
        _wait_for_targets(stack.address, 2)
        first = client.stream("def f(", max_tokens=200, ignore_eos=True)
        second = client.stream("class A:", max_tokens=200, ignore_eos=True)
        heads = [next(first), next(second)]
        assert sorted(_busy(stack.address).values()) == [1, 1]  # least-loaded: one session on each

        holder = next(name for name in ("target", "target-1") if _busy(stack.address)[stack.addresses[name]])
        stack.stop_worker(holder)  # its session must finish on the other replica
        rests = [[t for c in stream for t in c.token_ids] for stream in (first, second)]
        outputs = [list(head.token_ids) + rest for head, rest in zip(heads, rests)]
        assert outputs == [_target_only(engine, "def f(", 200), _target_only(engine, "class A:", 200)]

        deadline = time.monotonic() + 10
        while stack.addresses[holder] in {r.address for r in _replicas(stack.address).replicas if r.state == "serving"}:
            assert time.monotonic() < deadline, "the stopped replica still counts as serving"
            time.sleep(0.2)
        assert list(client.generate("def f(", max_tokens=20, ignore_eos=True).token_ids) == outputs[0][:20]


def test_a_replica_serving_another_model_is_refused(engine: SpeculativeEngine) -> None:
    with LocalStack(num_targets=1) as stack:
        stranger = stack.start_worker("target", name="target-stranger", model="tiny-draft")  # another model
        stack.stop_worker("orchestrator")
        stack.start_orchestrator()
        addresses = {r.address for r in _replicas(stack.address).replicas if r.role == "target"}
        assert addresses == {stack.addresses["target"]} and stranger not in addresses
        with SpecServeClient(stack.address) as client:
            assert list(client.generate("x = ", max_tokens=10, ignore_eos=True).token_ids) == _target_only(
                engine, "x = ", 10
            )


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack() as stack:
        yield stack


def test_admin_api_on_fixed_addresses(stack: LocalStack) -> None:
    replica_set = _replicas(stack.address)
    assert (replica_set.desired_target_replicas, replica_set.desired_draft_replicas) == (1, 1)
    assert {(r.role, r.state) for r in replica_set.replicas} == {("target", "serving"), ("draft", "serving")}
    with grpc.insecure_channel(stack.address) as channel:
        admin = pb_grpc.AdminStub(channel)
        for request, code in (
            (pb.ScaleRequest(target_replicas=2), grpc.StatusCode.FAILED_PRECONDITION),  # nothing can start one
            (pb.ScaleRequest(), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.ScaleRequest(target_replicas=0), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.ScaleRequest(draft_replicas=-1), grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.RpcError) as raised:
                admin.Scale(request, timeout=10)
            assert raised.value.code() == code, (request, raised.value.details())
