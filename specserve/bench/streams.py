"""The load bench's requests as streams of token ids (bench/load.py): a served mode's over gRPC, or a peer's
(bench/llama_cpp_peer.py), either cancelled from another thread at a timed window's end."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import grpc

from specserve_client import SpecServeClient, build_request

if TYPE_CHECKING:
    from protos import specserve_pb2 as pb

Prompt = tuple[str, bool]  # (text, send through the chat template)
Chunk = tuple[Sequence[int], "pb.GenerationStats | None"]  # token ids, the request's statistics (the last: final)


class StreamError(Exception):
    """A streamed request failed; `cancelled`: because it was cancelled (at the window's end)."""

    def __init__(self, message: str, cancelled: bool) -> None:
        super().__init__(message)
        self.cancelled = cancelled


class Stream(Protocol):
    """One streamed request: iterated, its chunks (raises StreamError); cancel() ends it from another thread."""

    def __iter__(self) -> Iterator[Chunk]: ...

    def cancel(self) -> None: ...


Send = Callable[[Prompt, int], Stream]
"""(prompt, max tokens) -> the request's stream, in one mode."""


class ServedStream:
    """A served mode's request: GenerateStream on the orchestrator that serves the mode, at `k` (None: adaptive)."""

    def __init__(
        self, client: SpecServeClient, k: int | None, prompt: Prompt, max_tokens: int, temperature: float
    ) -> None:
        text, chat = prompt
        message = {"messages": [("user", text)]} if chat else {"prompt": text}
        request = build_request(
            **message, max_tokens=max_tokens, num_speculative_tokens=k, ignore_eos=True,
            temperature=temperature,  # no seed: a seeded sample keeps a fixed k
        )  # fmt: skip
        self.call = client.stub.GenerateStream(request, timeout=client.timeout_s)

    def __iter__(self) -> Iterator[Chunk]:
        try:
            for chunk in self.call:
                yield chunk.token_ids, chunk.stats
        except grpc.RpcError as error:
            raise StreamError(str(error), error.code() == grpc.StatusCode.CANCELLED) from error

    def cancel(self) -> None:
        self.call.cancel()
