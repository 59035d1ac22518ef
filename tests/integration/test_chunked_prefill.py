"""Chunked prefill: a prompt is cached a chunk per pass, with the same result as one pass, and the other
sessions' passes run between the chunks instead of waiting for the whole prompt."""

from __future__ import annotations

import asyncio
import time

import grpc
import torch

from inprocess.engine import SpeculativeEngine
from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.config import GenerationRequest
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence
from specserve_client import SpecServeClient
from tests.helpers import assert_divergence_is_near_tie
from tests.stack import LocalStack

LONG_PROMPT = "def parse(line):\n    fields = line.split(',')\n" * 6


def test_a_prefill_in_chunks_caches_what_one_pass_does(tiny_target: LoadedModel) -> None:
    prompt = list(range(3, 103))
    whole, chunked = CachedSequence(tiny_target.model, prompt), CachedSequence(tiny_target.model, prompt)
    assert whole.prefill() is True and whole.num_cached == 99  # the last prompt token waits for the first round
    done = [chunked.prefill(max_tokens=32) for _ in range(4)]
    assert done == [False, False, False, True] and chunked.num_cached == 99
    assert chunked.prefill(max_tokens=32) is True  # nothing left: no pass
    torch.testing.assert_close(chunked.feed(1), whole.feed(1), rtol=1e-4, atol=1e-4)


def test_served_output_with_small_chunks_matches_target_only(
    engine: SpeculativeEngine, tiny_target: LoadedModel
) -> None:
    request = GenerationRequest(prompt=LONG_PROMPT, max_tokens=32, num_speculative_tokens=0, ignore_eos=True)
    reference = engine.generate(request).token_ids
    with LocalStack(workers={"prefill_chunk_tokens": 16}) as stack, SpecServeClient(stack.address) as client:
        for k in (0, 4):
            response = client.generate(LONG_PROMPT, max_tokens=32, num_speculative_tokens=k, ignore_eos=True)
            output = list(response.token_ids)
            assert_divergence_is_near_tie(tiny_target, engine.tokenize(request), reference, output)


def test_other_sessions_are_served_between_the_chunks_of_a_long_prompt() -> None:
    """A Propose sent while a long Prefill runs answers before that Prefill ends when the prompt goes in
    small chunks; with the whole prompt in one pass it waits behind it."""
    prompt = [3 + i % 250 for i in range(500)]

    async def prefill_seconds(draft: pb_grpc.DraftServiceStub) -> float:
        started = time.perf_counter()
        await draft.Prefill(pb.PrefillRequest(session_id="timing", prompt_token_ids=prompt), timeout=60)
        return time.perf_counter() - started

    async def race(address: str, delay: float | None) -> tuple[list[str], float]:
        async with grpc.aio.insecure_channel(address) as channel:
            draft = pb_grpc.DraftServiceStub(channel)
            await draft.Prefill(pb.PrefillRequest(session_id="short", prompt_token_ids=[5, 6, 7]), timeout=30)
            one_prefill = await prefill_seconds(draft)
            finished: list[str] = []

            async def prefill_long() -> None:
                await draft.Prefill(pb.PrefillRequest(session_id="long", prompt_token_ids=prompt), timeout=60)
                finished.append("prefill")

            async def propose() -> None:
                await asyncio.sleep(delay if delay is not None else one_prefill / 3)  # the prefill is under way
                request = pb.ProposeRequest(session_id="short", num_kept=3, k=4, sampling=pb.SamplingParams(top_p=1.0))
                await draft.Propose(request, timeout=60)
                finished.append("propose")

            await asyncio.gather(prefill_long(), propose())
            return finished, one_prefill

    with LocalStack(workers={"prefill_chunk_tokens": 1024}) as stack:  # longer than the prompt: one pass
        order, one_pass_s = stack.call(race(stack.addresses["draft"], None))
        assert order == ["prefill", "propose"], one_pass_s
    with LocalStack(workers={"prefill_chunk_tokens": 8}) as stack:
        order, chunked_s = stack.call(race(stack.addresses["draft"], one_pass_s / 3))
        assert order == ["propose", "prefill"], (one_pass_s, chunked_s)
