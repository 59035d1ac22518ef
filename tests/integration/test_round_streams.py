"""Every session's rounds on one bidirectional stream per worker (orchestrator/round_stream.py,
specserve/worker/rounds.py): the same answers as the unary calls; calls made together share a message and a
pass; an error, a deadline or a cancellation is one call's alone; a dead worker fails every waiting call."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest

from orchestrator.remote import DraftClient, TargetClient
from protos import specserve_pb2 as pb
from specserve.core.types import Proposal, SamplingParams
from specserve.launcher import worker_processes
from specserve.models.loading import ModelConfig
from tests.faults import Delay, Fail
from tests.stack import LocalStack

GREEDY = SamplingParams()
PROMPT = [5, 17, 42, 9, 100, 3]


async def _unary_verify(client: TargetClient, session_id: str, draft_token_ids: list[int]) -> list[int]:
    request = pb.VerifyRequest(session_id=session_id, draft_token_ids=draft_token_ids, sampling=pb.SamplingParams())
    return list((await client._call("Verify", request, 10)).token_ids)


async def _code(call: asyncio.Future[object]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_round_calls_answer_as_unary_calls_and_an_error_is_its_call_alone() -> None:
    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            for session_id in ("streamed", "unary", "other"):
                await client.prefill(session_id, PROMPT, None)
            for drafts in ([], [7, 8], [1], []):
                verdict, _ = await client.verify("streamed", Proposal(drafts), GREEDY)
                assert verdict.token_ids == await _unary_verify(client, "unary", drafts)
            calls = [  # in one message: two good calls, an unknown session, a draft outside the vocabulary
                client.verify("streamed", Proposal([3]), GREEDY),
                client.verify("never-prefilled", Proposal([]), GREEDY),
                client.verify("other", Proposal([10**6]), GREEDY),
                client.verify("other", Proposal([2]), GREEDY),  # after its session's failed call, in order
            ]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert results[0][0].token_ids == await _unary_verify(client, "unary", [3])  # type: ignore[index]
            for error, code in zip(results[1:3], (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)):
                assert isinstance(error, grpc.aio.AioRpcError) and error.code() == code
                assert (error.details() or "").startswith(f"{address}: ")
            assert not isinstance(results[3], BaseException) and len(results[3][0].token_ids) >= 1
            verdict, _ = await client.verify("streamed", Proposal([2]), GREEDY)  # the stream serves on
            assert verdict.token_ids == await _unary_verify(client, "unary", [2])
            assert client.rounds.num_streams == 1 and len(client.rounds) == 0
        finally:
            await client.close()

    with LocalStack(draft=None) as stack:
        stack.call(run(stack.addresses["target"]))


def test_calls_made_together_share_a_message_and_the_workers_pass() -> None:
    sessions = [f"s{i}" for i in range(4)]

    async def run(target_address: str, draft_address: str) -> None:
        target, draft = TargetClient(target_address), DraftClient(draft_address)
        try:
            for session_id in sessions:
                await target.prefill(session_id, PROMPT, None)
                await draft.prefill(session_id, PROMPT, None)
            proposed = await asyncio.gather(
                *(draft.propose(s, len(PROMPT), [], 3, GREEDY, 259) for s in sessions)
            )
            assert [report.batch_size for _, report in proposed] == [4] * 4
            verified = await asyncio.gather(
                *(target.verify(s, proposal, GREEDY) for s, (proposal, _) in zip(sessions, proposed))
            )
            assert [report.batch_size for _, report in verified] == [4] * 4
            assert target.rounds.num_streams == draft.rounds.num_streams == 1
        finally:
            await target.close()
            await draft.close()

    with LocalStack() as stack:
        stack.call(run(stack.addresses["target"], stack.addresses["draft"]))


def test_a_call_past_its_deadline_or_cancelled_is_dropped_and_the_others_go_on() -> None:
    slow = Delay("Verify", seconds=1.0, skip=3, times=2)  # the fourth and fifth Verify calls answer 1 s late

    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            for session_id in ("s", "other", "reference"):
                await client.prefill(session_id, PROMPT, None)
            first, _ = await client.verify("s", Proposal([]), GREEDY)
            assert first.token_ids == await _unary_verify(client, "reference", [])  # two calls passed untouched
            others = asyncio.ensure_future(client.verify("other", Proposal([]), GREEDY))  # the third
            waiting = asyncio.ensure_future(client.verify("s", Proposal([]), GREEDY))  # in the same message, held
            assert len((await others)[0].token_ids) == 1
            assert waiting.cancel()  # the caller goes away mid-round
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert len(client.rounds) == 0
            request = pb.VerifyRequest(session_id="s", sampling=pb.SamplingParams())
            late = asyncio.ensure_future(client.rounds.call("s", request, 0.2))  # held
            on_time = asyncio.ensure_future(client.verify("other", Proposal([]), GREEDY))  # in the same message
            assert await _code(late) == grpc.StatusCode.DEADLINE_EXCEEDED and len((await on_time)[0].token_ids) == 1
            assert slow.num_injected == 2 and len(client.rounds) == 0
            await asyncio.sleep(1.0)  # past the held calls' delay: neither ran, the session did not advance
            nxt, _ = await client.verify("s", Proposal([]), GREEDY)
            assert nxt.token_ids == await _unary_verify(client, "reference", [])
            assert client.rounds.num_streams == 1
        finally:
            await client.close()

    with LocalStack(draft=None, interceptors={"target": [slow]}) as stack:
        stack.call(run(stack.addresses["target"]))


def test_a_failed_call_is_its_own_and_a_stopping_worker_refuses_the_next_rounds() -> None:
    fail = Fail("Propose", grpc.StatusCode.INTERNAL, skip=1, times=1)  # the second Propose

    async def run(address: str, stop: asyncio.Event) -> None:
        client = DraftClient(address)
        try:
            for session_id in ("a", "b"):
                await client.prefill(session_id, PROMPT, None)
            codes = await asyncio.gather(
                *(_code(client.propose(s, len(PROMPT), [], 2, GREEDY, 259)) for s in ("a", "b"))  # type: ignore[arg-type]
            )
            assert codes == [grpc.StatusCode.OK, grpc.StatusCode.INTERNAL] and fail.num_injected == 1
            stop.set()  # the worker stops: within its grace, the stream's next rounds are refused
            await asyncio.sleep(0.2)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.propose("a", len(PROMPT) + 2, [], 2, GREEDY, 259)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (refused.value.details() or "")
        finally:
            await client.close()

    with LocalStack(interceptors={"draft": [fail]}) as stack:
        stack.call(run(stack.addresses["draft"], stack.stops["draft"]))


def test_a_killed_worker_fails_every_waiting_call_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    async def run(address: str, pid: int) -> None:
        client = TargetClient(address)
        try:
            deadline = time.monotonic() + 120
            while True:  # loading the model
                try:
                    await client.model_info()
                    break
                except grpc.aio.AioRpcError:
                    assert time.monotonic() < deadline, "the target worker did not serve in time"
                    await asyncio.sleep(0.2)
            for session_id in ("a", "b"):
                await client.prefill(session_id, PROMPT, None)
            await client.verify("a", Proposal([]), GREEDY)
            os.kill(pid, signal.SIGSTOP)  # frozen: the next calls wait
            calls = [asyncio.ensure_future(client.verify(s, Proposal([]), GREEDY)) for s in ("a", "b")]
            await asyncio.sleep(0.3)
            assert not any(call.done() for call in calls) and len(client.rounds) == 2
            os.kill(pid, signal.SIGKILL)
            codes = await asyncio.wait_for(asyncio.gather(*(_code(c) for c in calls)), 10)  # type: ignore[arg-type]
            assert codes == [grpc.StatusCode.UNAVAILABLE] * 2
            with pytest.raises(grpc.aio.AioRpcError) as raised:  # on a new stream, to a worker that is gone
                await client.verify("a", Proposal([]), GREEDY)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and address in (raised.value.details() or "")
            assert client.rounds.num_streams == 2
        finally:
            await client.close()

    tiny = ModelConfig("tiny", device="cpu", dtype="float32")
    with worker_processes(tiny, None) as workers:
        asyncio.run(run(workers["target"], workers.processes["target"].pid))


def test_a_malformed_message_is_invalid_argument_and_the_worker_keeps_serving() -> None:
    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            await client.prefill("s", PROMPT, None)
            for method, request, response_type in (
                ("VerifyStream", pb.VerifyRequest(session_id="s", sampling=pb.SamplingParams()), pb.VerifyResponse),
                ("VerifyRounds", pb.VerifyBatch(calls=[pb.VerifyBatch.Call(call_id=7, request=pb.VerifyRequest(
                    session_id="s", sampling=pb.SamplingParams()))]), pb.VerifyResults),
            ):  # fmt: skip
                path = f"/specserve.v1.TargetService/{method}"
                call = client.channel.stream_stream(path, request_serializer=None, response_deserializer=None)()
                await call.write(request.SerializeToString())
                assert response_type.FromString(await call.read()).ByteSize() > 0
                await call.write(b"\xff\xff\xff")  # not a message of the stream's type
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await call.read()
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            verdict, _ = await client.verify("s", Proposal([]), GREEDY)
            assert len(verdict.token_ids) == 1
        finally:
            await client.close()

    with LocalStack(draft=None) as stack:
        stack.call(run(stack.addresses["target"]))


def test_calls_too_big_to_share_a_message_go_in_several_and_one_too_big_to_send_fails_alone() -> None:
    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            await client.prefill("s", PROMPT, None)
            big = pb.VerifyRequest(session_id="s", draft_token_ids=[1] * 3_000_000)  # 3 MB: refused, never run
            huge = pb.VerifyRequest(session_id="s", draft_token_ids=[1] * 9_000_000)  # over the 8 MiB limit
            calls = [client.rounds.call("s", request, 30) for request in (big, big, huge, big)]
            codes = await asyncio.gather(*(_code(call) for call in calls))  # type: ignore[arg-type]
            invalid, exhausted = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
            assert codes == [invalid, invalid, exhausted, invalid]
            verdict, _ = await client.verify("s", Proposal([]), GREEDY)
            assert len(verdict.token_ids) == 1 and client.rounds.num_streams == 1
        finally:
            await client.close()

    with LocalStack(draft=None) as stack:
        stack.call(run(stack.addresses["target"]))


def test_a_run_decodes_what_single_rounds_do_and_sends_each_token_as_it_comes() -> None:
    sampled = SamplingParams(temperature=1.0)

    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            for session_id, seed in (("run", None), ("steps", None), ("sampled-run", 7), ("sampled-steps", 7)):
                await client.prefill(session_id, PROMPT, seed)
            for session_id, sampling in (("", GREEDY), ("sampled-", sampled)):
                heard: list[list[int]] = []
                report = await client.decode_run(f"{session_id}run", 12, frozenset(), sampling, heard.append)
                steps = [(await client.verify(f"{session_id}steps", Proposal([]), sampling))[0] for _ in range(12)]
                assert heard == [verdict.token_ids for verdict in steps]  # one by one, as single rounds decode
                assert report.pass_s > 0
            reference = sum(heard, [])
            for session_id in ("stops", "stops-reference"):
                await client.prefill(session_id, PROMPT, 7)
            heard = []
            await client.decode_run("stops", 12, frozenset({reference[4]}), sampled, heard.append)
            assert sum(heard, []) == reference[: reference.index(reference[4]) + 1]  # ends after a stop token
            bad_runs = [
                pb.VerifyRequest(session_id="run", num_tokens=3, draft_token_ids=[1]),  # a run takes no drafts
                pb.VerifyRequest(session_id="run", num_tokens=10**6),  # past the context
                pb.VerifyRequest(session_id="run", num_tokens=-1),
            ]
            for request in bad_runs:
                request.sampling.CopyFrom(pb.SamplingParams())
                assert await _code(client.rounds.call("run", request, 10)) == grpc.StatusCode.INVALID_ARGUMENT
            assert len(await _unary_run(client, "steps", 5)) == 5  # unary: every token in the answer
            assert client.rounds.num_streams == 1 and len(client.rounds) == 0
        finally:
            await client.close()

    with LocalStack(draft=None) as stack:
        stack.call(run(stack.addresses["target"]))


async def _unary_run(client: TargetClient, session_id: str, num_tokens: int) -> list[int]:
    request = pb.VerifyRequest(session_id=session_id, sampling=pb.SamplingParams(), num_tokens=num_tokens)
    return list((await client._call("Verify", request, 10)).token_ids)
