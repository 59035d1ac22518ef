"""Python clients of the public API, sync and asyncio; every call has a deadline. No model library: grpc,
protobuf, the generated messages and specserve.security. `SpecServeClient("127.0.0.1:50051").generate(
"def fib(n):", max_tokens=64).text`; TLS and a key: `tls=TLSConfig(ca="ca.pem"), api_key="..."`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.security import TLSConfig, aio_channel, client_channel


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[tuple[str, str]] | None = None,
    max_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    num_speculative_tokens: int | None = None,
    ignore_eos: bool = False,
) -> pb.GenerateRequest:
    """The GenerateRequest of these arguments. The server validates it: a bad value comes back as
    INVALID_ARGUMENT naming the field. Only max_tokens is checked here, since 0 on the wire means the default."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    return pb.GenerateRequest(
        prompt=prompt or "",
        messages=[pb.ChatMessage(role=role, content=content) for role, content in messages or ()],
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=list(stop),
        num_speculative_tokens=num_speculative_tokens,
        ignore_eos=ignore_eos,
    )


class SpecServeClient:
    def __init__(
        self, address: str, timeout_s: float = 600.0, *, tls: TLSConfig | None = None, api_key: str | None = None
    ) -> None:
        """tls: connect over TLS (trusting tls.ca); api_key: sent as a bearer token with every call."""
        self.channel = client_channel(address, tls, api_key)
        self.stub = pb_grpc.OrchestratorStub(self.channel)
        self.timeout_s = timeout_s

    def generate(self, prompt: str | None = None, **kwargs: Any) -> pb.GenerateResponse:
        return self.stub.Generate(build_request(prompt, **kwargs), timeout=self.timeout_s)

    def stream(self, prompt: str | None = None, **kwargs: Any) -> Iterator[pb.GenerateChunk]:
        yield from self.stub.GenerateStream(build_request(prompt, **kwargs), timeout=self.timeout_s)

    def info(self) -> pb.ServerInfoResponse:
        return self.stub.GetServerInfo(pb.ServerInfoRequest(), timeout=10.0)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> SpecServeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSpecServeClient:
    def __init__(
        self, address: str, timeout_s: float = 600.0, *, tls: TLSConfig | None = None, api_key: str | None = None
    ) -> None:
        self.channel = aio_channel(address, tls, api_key)
        self.stub = pb_grpc.OrchestratorStub(self.channel)
        self.timeout_s = timeout_s

    async def generate(self, prompt: str | None = None, **kwargs: Any) -> pb.GenerateResponse:
        return await self.stub.Generate(build_request(prompt, **kwargs), timeout=self.timeout_s)

    async def stream(self, prompt: str | None = None, **kwargs: Any) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in self.stub.GenerateStream(build_request(prompt, **kwargs), timeout=self.timeout_s):
            yield chunk

    async def info(self) -> pb.ServerInfoResponse:
        return await self.stub.GetServerInfo(pb.ServerInfoRequest(), timeout=10.0)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncSpecServeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
