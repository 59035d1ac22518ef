"""A session's rounds on one bidirectional stream per worker (orchestrator/round_stream.py): the same
answers as the unary calls, an error ends only that session's stream with the unary call's status, and a
call cancelled or timed out mid-stream leaves the session usable on a fresh stream."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from orchestrator.remote import DraftClient, TargetClient
from protos import specserve_pb2 as pb
from specserve.core.types import Proposal, SamplingParams
from tests.faults import Delay
from tests.stack import LocalStack

GREEDY = SamplingParams()
PROMPT = [5, 17, 42, 9, 100, 3]


async def _unary_verify(client: TargetClient, session_id: str, draft_token_ids: list[int]) -> list[int]:
    request = pb.VerifyRequest(session_id=session_id, draft_token_ids=draft_token_ids, sampling=pb.SamplingParams())
    return list((await client._call("Verify", request, 10)).token_ids)


def test_streamed_rounds_answer_as_unary_calls_and_an_error_ends_only_its_stream() -> None:
    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            await client.prefill("streamed", PROMPT, None)
            await client.prefill("unary", PROMPT, None)
            for drafts in ([], [7, 8], [1], []):
                verdict, _ = await client.verify("streamed", Proposal(drafts), GREEDY)
                assert verdict.token_ids == await _unary_verify(client, "unary", drafts)
            assert len(client.rounds) == 1  # one stream for the session's four rounds
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.verify("never-prefilled", Proposal([]), GREEDY)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND and address in (raised.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as raised:  # a draft id outside the vocabulary
                await client.verify("streamed", Proposal([10**6]), GREEDY)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert len(client.rounds) == 0  # both failed streams were dropped
            verdict, _ = await client.verify("streamed", Proposal([2]), GREEDY)  # a fresh stream, same session
            assert verdict.token_ids == await _unary_verify(client, "unary", [2])
        finally:
            await client.close()

    with LocalStack(draft=None) as stack:
        stack.call(run(stack.addresses["target"]))


def test_a_malformed_message_mid_stream_is_invalid_argument_and_the_worker_keeps_serving() -> None:
    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            await client.prefill("s", PROMPT, None)
            call = client.channel.stream_stream(
                "/specserve.v1.TargetService/VerifyStream", request_serializer=None, response_deserializer=None
            )()
            await call.write(pb.VerifyRequest(session_id="s", sampling=pb.SamplingParams()).SerializeToString())
            assert pb.VerifyResponse.FromString(await call.read()).token_ids
            await call.write(b"\xff\xff\xff")  # not a VerifyRequest
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            verdict, _ = await client.verify("s", Proposal([]), GREEDY)
            assert len(verdict.token_ids) == 1
        finally:
            await client.close()

    with LocalStack(draft=None) as stack:
        stack.call(run(stack.addresses["target"]))


def test_a_cancelled_or_late_round_leaves_the_session_usable_on_a_new_stream() -> None:
    slow = Delay("Verify", seconds=1.0, skip=2, times=2)  # the third and fourth Verify calls answer 1 s late

    async def run(address: str) -> None:
        client = TargetClient(address)
        try:
            await client.prefill("s", PROMPT, None)
            await client.prefill("reference", PROMPT, None)
            first, _ = await client.verify("s", Proposal([]), GREEDY)
            assert first.token_ids == await _unary_verify(client, "reference", [])  # the two calls passed untouched
            waiting = asyncio.ensure_future(client.verify("s", Proposal([]), GREEDY))
            await asyncio.sleep(0.2)
            waiting.cancel()  # the caller went away mid-round: the worker's handler is cancelled in the delay
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert len(client.rounds) == 0
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.rounds.call("s", pb.VerifyRequest(session_id="s", sampling=pb.SamplingParams()), 0.2)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and len(client.rounds) == 0
            assert slow.num_injected == 2
            await asyncio.sleep(1.0)  # let the cancelled rounds' handlers end
            nxt, _ = await client.verify("s", Proposal([]), GREEDY)  # neither late round advanced the session
            assert nxt.token_ids == await _unary_verify(client, "reference", [])
        finally:
            await client.close()

    with LocalStack(draft=None, interceptors={"target": [slow]}) as stack:
        stack.call(run(stack.addresses["target"]))


def test_a_draft_session_proposes_on_its_stream_and_release_closes_it() -> None:
    async def run(address: str) -> None:
        client = DraftClient(address)
        try:
            await client.prefill("s", PROMPT, None)
            proposal, report = await client.propose("s", len(PROMPT), [], 3, GREEDY, 259)
            assert len(proposal.token_ids) == 3 and report.pass_s > 0 and report.compute_s >= report.pass_s
            assert len(client.rounds) == 1
            await client.release("s")
            assert len(client.rounds) == 0
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.propose("s", len(PROMPT) + 3, [1], 2, GREEDY, 259)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            await client.close()

    with LocalStack() as stack:
        stack.call(run(stack.addresses["draft"]))
