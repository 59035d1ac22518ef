"""The worker's side of a round stream (specserve/worker/rounds.py), without a model or gRPC: results ready
together share a message, a session's calls run in order while other sessions' run beside them, a cancelled
call answers nothing, a stopping worker refuses, and results too big for one message go in several."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from protos import specserve_pb2 as pb
from specserve.rpc import BATCH_MESSAGE_BYTES
from specserve.worker.rounds import Partial, answer_batches
from specserve.worker.sessions import SessionNotFoundError

METHOD = "/specserve.v1.DraftService/Propose"


def _call(call_id: int, session_id: str, k: int = 1) -> pb.ProposeBatch.Call:
    return pb.ProposeBatch.Call(call_id=call_id, request=pb.ProposeRequest(session_id=session_id, k=k))


async def _serve(
    batches: list[pb.ProposeBatch | float],
    answer: Callable[[pb.ProposeRequest], Awaitable[pb.ProposeResponse]],
    stopping: Callable[[], bool] = lambda: False,
) -> list[pb.ProposeResults]:
    """The results messages answer_batches sends for `batches` (a float: a pause of that many seconds)."""

    async def incoming() -> AsyncIterator[pb.ProposeBatch]:
        for batch in batches:
            if isinstance(batch, float):
                await asyncio.sleep(batch)
            else:
                yield batch

    async def answer_call(request: pb.ProposeRequest, partial: object) -> pb.ProposeResponse:
        return await answer(request)

    return [results async for results in answer_batches(incoming(), answer_call, pb.ProposeResults, METHOD, stopping)]


def _outcomes(messages: list[pb.ProposeResults]) -> dict[int, list[int] | grpc.StatusCode]:
    """Each call's proposed token ids, or its error's status."""
    codes = {code.value[0]: code for code in grpc.StatusCode}
    return {
        r.call_id: list(r.response.token_ids) if r.HasField("response") else codes[r.error.code]
        for m in messages
        for r in m.results
    }


def test_results_ready_together_share_a_message_and_a_session_runs_in_order() -> None:
    log: list[tuple[str, str]] = []

    async def answer(request: pb.ProposeRequest) -> pb.ProposeResponse:
        log.append(("start", f"{request.session_id}{request.k}"))
        await asyncio.sleep(0.05)
        log.append(("end", f"{request.session_id}{request.k}"))
        if request.session_id == "gone":
            raise SessionNotFoundError("session gone is not open")
        return pb.ProposeResponse(token_ids=[request.k])

    batch = pb.ProposeBatch(calls=[_call(1, "a", 1), _call(2, "b", 1), _call(3, "a", 2), _call(4, "gone")])
    messages = asyncio.run(_serve([batch], answer))
    assert _outcomes(messages) == {1: [1], 2: [1], 3: [2], 4: grpc.StatusCode.NOT_FOUND}
    assert [len(m.results) for m in messages] == [3, 1]  # a1, b1 and gone together; then a2
    assert log.index(("end", "a1")) < log.index(("start", "a2"))  # a's second call waited for its first
    assert log.index(("start", "b1")) < log.index(("end", "a1"))  # b's ran beside a's


def test_a_cancelled_call_answers_nothing_and_a_stopping_worker_refuses() -> None:
    started: list[int] = []

    async def answer(request: pb.ProposeRequest) -> pb.ProposeResponse:
        started.append(request.k)
        await asyncio.sleep(0.3 if request.k == 1 else 0.0)
        return pb.ProposeResponse(token_ids=[request.k])

    first = pb.ProposeBatch(calls=[_call(1, "a", 1), _call(2, "b", 2)])
    cancel = pb.ProposeBatch(cancelled_call_ids=[1], calls=[_call(3, "a", 3)])
    assert _outcomes(asyncio.run(_serve([first, 0.1, cancel], answer))) == {2: [2], 3: [3]}
    refused = asyncio.run(_serve([first], answer, stopping=lambda: True))
    assert _outcomes(refused) == {1: grpc.StatusCode.UNAVAILABLE, 2: grpc.StatusCode.UNAVAILABLE}


def test_results_too_big_for_one_message_go_in_several() -> None:
    async def answer(request: pb.ProposeRequest) -> pb.ProposeResponse:
        return pb.ProposeResponse(token_ids=[1] * (BATCH_MESSAGE_BYTES // 3))  # a third of a message each

    messages = asyncio.run(_serve([pb.ProposeBatch(calls=[_call(i, f"s{i}") for i in range(5)])], answer))
    assert sorted(r.call_id for m in messages for r in m.results) == list(range(5))
    assert len(messages) == 3 and all(m.ByteSize() <= BATCH_MESSAGE_BYTES for m in messages)


def test_partial_results_go_ahead_of_their_call_and_share_messages_with_other_results() -> None:
    async def answer(request: pb.VerifyRequest, partial: Partial) -> pb.VerifyResponse:
        for token_id in range(request.num_tokens - 1):  # a run: each token but the last ahead
            partial(pb.VerifyResponse(token_ids=[token_id]))
            await asyncio.sleep(0.01)
        return pb.VerifyResponse(token_ids=list(range(request.num_tokens)))

    async def batches() -> AsyncIterator[pb.VerifyBatch]:
        calls = [(1, "run", 3), (2, "step", 1)]
        yield pb.VerifyBatch(calls=[pb.VerifyBatch.Call(call_id=c, request=pb.VerifyRequest(session_id=s, num_tokens=n))
                                    for c, s, n in calls])  # fmt: skip

    async def serve() -> list[pb.VerifyResults]:
        stream = answer_batches(batches(), answer, pb.VerifyResults, METHOD, lambda: False)
        return [results async for results in stream]

    results = [(r.call_id, r.partial, list(r.response.token_ids)) for m in asyncio.run(serve()) for r in m.results]
    assert results == [(1, True, [0]), (2, False, [0]), (1, True, [1]), (1, False, [0, 1, 2])]
