"""The workers' clients: a channel the replica pool closed fails like a dead worker."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from orchestrator.remote import DraftClient, TargetClient
from specserve.core.types import Proposal, SamplingParams


def _unavailable_after_close(call: str) -> grpc.StatusCode:
    async def run() -> grpc.StatusCode:
        target, draft = TargetClient("127.0.0.1:9"), DraftClient("127.0.0.1:9")
        await target.close()
        await draft.close()
        calls = {
            "release": lambda: target.release("s"),
            "verify": lambda: target.verify("s", Proposal([1, 2]), SamplingParams()),
            "prefill": lambda: target.prefill("s", [1, 2, 3], None),
            "propose": lambda: draft.propose("s", 0, [1], 2, SamplingParams(), 32),
            "model_info": draft.model_info,
        }
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await calls[call]()
        assert "127.0.0.1:9" in (raised.value.details() or "")
        return raised.value.code()

    return asyncio.run(run())


@pytest.mark.parametrize("call", ["release", "verify", "prefill", "propose", "model_info"])
def test_a_call_on_a_closed_channel_is_unavailable(call: str) -> None:
    assert _unavailable_after_close(call) == grpc.StatusCode.UNAVAILABLE
