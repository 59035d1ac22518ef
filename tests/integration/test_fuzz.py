"""Hostile input against the served stack (tiny models): arbitrary messages for every RPC (field values and
sizes drawn by hypothesis from the proto descriptors), malformed bytes, garbage on the socket and oversized
messages. Only the expected status codes, never a hang, and a valid request still succeeds afterwards.

Reduced in `make test`; SPECSERVE_FUZZ_EXAMPLES=N runs N random examples per test (docs/reliability.md),
and SPECSERVE_FUZZ_REPORT=PATH writes the status codes seen as JSON."""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import specserve_pb2 as pb
from protos import specserve_pb2_grpc as pb_grpc
from specserve.rpc import MAX_MESSAGE_BYTES
from specserve_client import SpecServeClient
from tests.stack import LocalStack

FULL = "SPECSERVE_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("SPECSERVE_FUZZ_EXAMPLES", "12"))
CALL_TIMEOUT_S = 30.0  # far above any legitimate call on the tiny models: DEADLINE_EXCEEDED means a hang
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not FULL,  # CI sees the same examples every run; the full form explores
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

C = grpc.StatusCode
SERVICES = {  # server name in the stack -> services it serves
    "orchestrator": ["Orchestrator", "Admin"],
    "target": ["TargetService"],
    "draft": ["DraftService"],
}
ALLOWED: dict[str, set[grpc.StatusCode]] = {  # per RPC, for well-formed messages with arbitrary values
    "Orchestrator/Generate": {C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED},
    "Orchestrator/GenerateStream": {C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED},
    "Orchestrator/GetServerInfo": {C.OK},
    "Admin/ListReplicas": {C.OK},
    "Admin/Scale": {C.INVALID_ARGUMENT, C.FAILED_PRECONDITION},  # fixed addresses: scaling is refused
    "GetModelInfo": {C.OK},
    "Prefill": {C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED},
    "Propose": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND},
    "Verify": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND},
    "Release": {C.OK},
    "ProposeStream": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND},  # a session's Propose calls, one per message
    "VerifyStream": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND},
    "ProposeRounds": {C.OK},  # every session's Propose calls, many a message: a call's error is its result
    "VerifyRounds": {C.OK},
}
SESSIONS = ["fuzz-0", "fuzz-1", "fuzz-2"]  # prefilled before the worker tests, so deeper paths are reached
COUNTS: dict[str, Counter[str]] = defaultdict(Counter)


def allowed(service: str, method: str) -> set[grpc.StatusCode]:
    return ALLOWED.get(f"{service}/{method}") or ALLOWED[method]


# ---------------------------------------------------------------------------------------------------
# Strategies from the proto descriptors

INT32 = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([-(2**31), 2**31 - 1, -1, 0, 1, 511, 512, 4096]),
    st.integers(-(2**31), 2**31 - 1),
)
INT64 = st.one_of(INT32, st.sampled_from([-(2**63), 2**63 - 1]), st.integers(-(2**63), 2**63 - 1))
DOUBLE = st.one_of(st.floats(-2, 2), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, -0.0]))
FLOAT = st.floats(width=32, allow_nan=True, allow_infinity=True)
SHORT_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "def f(", "<|im_start|>", "\x00", "\u202e", "user", "system", "assistant"]),
)
TEXT = st.one_of(  # only top-level strings get huge: a repeated one would build gigabytes in this process
    SHORT_TEXT, st.integers(1, 2_000_000).map(lambda n: "x" * n)  # up to 2 MB: far over the context
)
TOKEN_IDS = st.one_of(
    st.lists(st.integers(0, 259), max_size=12),
    st.lists(INT32, max_size=6),
    st.tuples(st.integers(0, 300), st.integers(0, 400_000)).map(lambda t: [t[0]] * t[1]),  # up to 1.6 MB
)
OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    "session_id": st.one_of(st.sampled_from(SESSIONS), TEXT),
    "prompt_token_ids": TOKEN_IDS,
    "new_token_ids": TOKEN_IDS,
    "draft_token_ids": TOKEN_IDS,
    "token_ids": TOKEN_IDS,
}
SHORT_TOKEN_IDS = st.one_of(st.lists(st.integers(0, 259), max_size=12), st.lists(INT32, max_size=6))
REPEATED_OVERRIDES = {  # in a message that is repeated (a round stream's calls), thousands of times: all short
    name: st.one_of(st.sampled_from(SESSIONS), SHORT_TEXT) if name == "session_id" else SHORT_TOKEN_IDS
    for name in OVERRIDES
}


SMALL_TEXT = st.text(max_size=12)
SAMPLING = st.builds(
    pb.SamplingParams, temperature=st.floats(0, 2), top_p=st.floats(0.01, 1), top_k=st.integers(0, 300)
)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {  # near-valid requests, so the deep paths run too
    "GenerateRequest": st.builds(
        pb.GenerateRequest,
        prompt=st.one_of(SMALL_TEXT.filter(bool), st.just("def f(")),
        max_tokens=st.integers(0, 24),
        temperature=st.one_of(st.just(0.0), st.floats(0, 2)),
        top_p=st.one_of(st.none(), st.floats(0.01, 1)),
        top_k=st.integers(0, 300),
        seed=st.one_of(st.none(), INT64),
        stop=st.lists(SMALL_TEXT, max_size=3),
        num_speculative_tokens=st.one_of(st.none(), st.integers(0, 8)),
        ignore_eos=st.booleans(),
    ),
    "PrefillRequest": st.builds(pb.PrefillRequest, session_id=st.sampled_from(SESSIONS),
                                prompt_token_ids=st.lists(st.integers(0, 259), min_size=1, max_size=40)),  # fmt: skip
    "ProposeRequest": st.builds(pb.ProposeRequest, session_id=st.sampled_from(SESSIONS), num_kept=st.integers(0, 6),
                                new_token_ids=st.lists(st.integers(0, 259), max_size=3), k=st.integers(0, 8),
                                sampling=SAMPLING),  # fmt: skip
    "VerifyRequest": st.one_of(
        st.builds(pb.VerifyRequest, session_id=st.sampled_from(SESSIONS), sampling=SAMPLING,
                  draft_token_ids=st.lists(st.integers(0, 259), max_size=8)),  # fmt: skip
        st.lists(st.lists(st.tuples(st.integers(0, 259), FLOAT), min_size=1, max_size=3), max_size=6).flatmap(
            lambda rows: st.builds(pb.VerifyRequest, session_id=st.sampled_from(SESSIONS), sampling=SAMPLING,
                                   draft_token_ids=st.just([row[0][0] for row in rows]),
                                   draft_probs=st.just(_sparse(rows)))  # fmt: skip
        ),  # sampled verification with draft distributions that line up, of arbitrary values
    ),
}
PLAUSIBLE |= {  # round streams' messages: near-valid calls, some ids repeated or cancelled
    f"{name}Batch": st.builds(
        getattr(pb, f"{name}Batch"),
        calls=st.lists(st.builds(getattr(pb, f"{name}Batch").Call, call_id=st.integers(0, 20),
                                 request=PLAUSIBLE[f"{name}Request"], request_id=SMALL_TEXT), max_size=8),
        cancelled_call_ids=st.lists(st.integers(0, 20), max_size=3),
    )  # fmt: skip
    for name in ("Propose", "Verify")
}


def _sparse(rows: list[list[tuple[int, float]]]) -> pb.SparseProbs:
    return pb.SparseProbs(
        row_lengths=[len(row) for row in rows],
        token_ids=[token for row in rows for token, _ in row],
        probs=[p for row in rows for _, p in row],
    )


def request(descriptor: Descriptor) -> st.SearchStrategy[Any]:
    """Arbitrary messages, and near-valid ones where the request has many ways to be invalid."""
    if descriptor.name in PLAUSIBLE:
        return st.one_of(message(descriptor), PLAUSIBLE[descriptor.name])
    return message(descriptor)


def message(descriptor: Descriptor, depth: int = 0, repeated: bool = False) -> st.SearchStrategy[Any]:
    """Any message of this type: every field may be absent, set to an edge value, huge, or long (only short
    when the message is `repeated`, an item of a repeated field or within one: there may be thousands)."""
    cls = GetMessageClass(descriptor)
    fields = {
        f.name: _field(f, depth, repeated)
        for f in descriptor.fields
        if depth < 3 or f.type != FieldDescriptor.TYPE_MESSAGE
    }
    return st.fixed_dictionaries({}, optional=fields).map(lambda kwargs: cls(**kwargs))


def _field(field: FieldDescriptor, depth: int, repeated: bool = False) -> st.SearchStrategy[Any]:
    if field.name in OVERRIDES and field.type != FieldDescriptor.TYPE_MESSAGE:
        return (REPEATED_OVERRIDES if repeated else OVERRIDES)[field.name]
    top_level_single = depth == 0 and not field.is_repeated
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        one = message(field.message_type, depth + 1, repeated or field.is_repeated)
    else:
        one = {
            FieldDescriptor.TYPE_INT32: INT32,
            FieldDescriptor.TYPE_INT64: INT64,
            FieldDescriptor.TYPE_UINT64: st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)),
            FieldDescriptor.TYPE_DOUBLE: DOUBLE,
            FieldDescriptor.TYPE_FLOAT: FLOAT,
            FieldDescriptor.TYPE_BOOL: st.booleans(),
            FieldDescriptor.TYPE_STRING: TEXT if top_level_single else SHORT_TEXT,
            FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
        }[field.type]
    if not field.is_repeated:
        return one
    if repeated:
        return st.lists(one, max_size=6)
    long_repeats = st.tuples(one, st.integers(0, 5_000)).map(lambda t: [t[0]] * t[1])
    return st.one_of(st.lists(one, max_size=6), long_repeats)


def malformed(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes that are not (quite) this message: random, truncated or bit-flipped encodings, wrong wire types."""

    def damage(data: bytes, position: int, flip: int, cut: int) -> bytes:
        if not data:
            return bytes([flip])
        i = position % len(data)
        return (data[:i] + bytes([data[i] ^ (flip or 1)]) + data[i + 1 :])[: max(1, len(data) - cut)]

    encoded = request(descriptor).map(lambda m: m.SerializeToString())
    return st.one_of(
        st.binary(max_size=256),
        st.builds(damage, encoded, st.integers(0, 2**16), st.integers(0, 255), st.integers(0, 8)),
        st.sampled_from([b"\xff" * 8, b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x03\xff\xfe\xfd", b"\x08", b"\x0b\x0c"]),
    )


# ---------------------------------------------------------------------------------------------------
# The stack and the calls


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    started = time.monotonic()
    with LocalStack() as running:
        yield running
    if path := os.environ.get("SPECSERVE_FUZZ_REPORT"):
        report = {"examples_per_test": EXAMPLES, "seconds": round(time.monotonic() - started, 1),
                  "calls": {rpc: dict(codes) for rpc, codes in sorted(COUNTS.items())}}  # fmt: skip
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


@pytest.fixture(scope="module")
def channels(stack: LocalStack) -> Iterator[dict[str, grpc.Channel]]:
    opened = {name: grpc.insecure_channel(stack.addresses[name]) for name in SERVICES}
    yield opened
    for channel in opened.values():
        channel.close()


def methods(*server_names: str) -> list[tuple[str, str, MethodDescriptor]]:
    return [
        (server, service, method)
        for server in server_names
        for service in SERVICES[server]
        for method in pb.DESCRIPTOR.services_by_name[service].methods
    ]


def call(channel: grpc.Channel, service: str, method: MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    """Send raw bytes to the method; the status it answers (a stream is read to its end)."""
    path = f"/specserve.v1.{service}/{method.name}"
    try:
        if method.client_streaming:  # one message on the stream, then its end
            rounds = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
            for _ in rounds(iter([payload]), timeout=CALL_TIMEOUT_S):
                pass
        elif method.server_streaming:
            stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
            for _ in stream(payload, timeout=CALL_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
                payload, timeout=CALL_TIMEOUT_S
            )
    except grpc.RpcError as error:
        return error.code()  # type: ignore[attr-defined, no-any-return]
    return C.OK


def check(service: str, method: MethodDescriptor, code: grpc.StatusCode, expected: set[grpc.StatusCode]) -> None:
    COUNTS[f"{service}/{method.name}"][code.name] += 1
    names = sorted(c.name for c in expected)
    assert code in expected, f"{service}/{method.name} answered {code.name}; allowed: {names}"


def still_serves(stack: LocalStack) -> None:
    """A valid request through both workers succeeds, and each worker answers directly."""
    with SpecServeClient(stack.address, timeout_s=60) as client:
        response = client.generate("def f(", max_tokens=6, num_speculative_tokens=2)
        assert len(response.token_ids) == 6 and response.stats.proposed > 0
    for name, stub in (("target", pb_grpc.TargetServiceStub), ("draft", pb_grpc.DraftServiceStub)):
        with grpc.insecure_channel(stack.addresses[name]) as channel:
            assert stub(channel).GetModelInfo(pb.ModelInfoRequest(), timeout=10).model


def prefill_sessions(stack: LocalStack) -> None:
    for name, stub in (("target", pb_grpc.TargetServiceStub), ("draft", pb_grpc.DraftServiceStub)):
        with grpc.insecure_channel(stack.addresses[name]) as channel:
            for session in SESSIONS:
                stub(channel).Prefill(pb.PrefillRequest(session_id=session, prompt_token_ids=[1, 2, 3]), timeout=10)


# ---------------------------------------------------------------------------------------------------
# The tests


def _fuzz(
    stack: LocalStack, channels: dict[str, grpc.Channel], server: str, service: str, method: MethodDescriptor,
    payloads: st.SearchStrategy[bytes], expected: set[grpc.StatusCode],
) -> None:  # fmt: skip
    if server != "orchestrator":
        prefill_sessions(stack)

    @FUZZ_SETTINGS
    @given(payload=payloads)
    def run(payload: bytes) -> None:
        check(service, method, call(channels[server], service, method, payload), expected)

    run()
    still_serves(stack)


@pytest.mark.parametrize(("server", "service", "method"), methods("orchestrator", "target", "draft"),
                         ids=lambda x: x if isinstance(x, str) else x.name)  # fmt: skip
def test_arbitrary_messages(
    stack: LocalStack, channels: dict[str, grpc.Channel], server: str, service: str, method: MethodDescriptor
) -> None:
    payloads = request(method.input_type).map(lambda m: m.SerializeToString())
    _fuzz(stack, channels, server, service, method, payloads, allowed(service, method.name))


@pytest.mark.parametrize(("server", "service", "method"), methods("orchestrator", "target", "draft"),
                         ids=lambda x: x if isinstance(x, str) else x.name)  # fmt: skip
def test_malformed_bytes(
    stack: LocalStack, channels: dict[str, grpc.Channel], server: str, service: str, method: MethodDescriptor
) -> None:
    expected = allowed(service, method.name) | {C.INVALID_ARGUMENT}
    _fuzz(stack, channels, server, service, method, malformed(method.input_type), expected)


@pytest.mark.parametrize("server", list(SERVICES))
def test_oversized_messages_are_resource_exhausted(
    stack: LocalStack, channels: dict[str, grpc.Channel], server: str
) -> None:
    payload = b"\x0a" + _varint(MAX_MESSAGE_BYTES + 16) + b"x" * (MAX_MESSAGE_BYTES + 16)  # one huge string field
    for _, service, method in methods(server):
        code = call(channels[server], service, method, payload)
        check(service, method, code, {C.RESOURCE_EXHAUSTED})
    still_serves(stack)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


GARBAGE = [
    b"\x00" * 64,
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 128,  # the HTTP/2 preface, then nonsense frames
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x7f\xff\xff\x00\x01" * 64,
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # the start of a TLS handshake
]


@pytest.mark.parametrize("server", list(SERVICES))
def test_garbage_on_the_socket_does_not_stop_the_server(stack: LocalStack, server: str) -> None:
    host, port = stack.addresses[server].rsplit(":", 1)
    payloads = GARBAGE + [os.urandom(n) for n in (1, 100, 10_000, 200_000)]
    for payload in payloads:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            try:
                sock.sendall(payload)
                sock.settimeout(2)
                sock.recv(4096)  # the server answers (a GOAWAY) or hangs up; either is fine
            except OSError:
                pass
    still_serves(stack)


def test_a_slow_loris_holds_no_model_thread(stack: LocalStack) -> None:
    """Half-open connections that never finish a request do not stop others being served."""
    host, port = stack.address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(32)]
    try:
        for sock in idle:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        still_serves(stack)
    finally:
        for sock in idle:
            sock.close()


def test_every_rpc_has_an_allowed_set() -> None:
    for _, service, method in methods(*SERVICES):
        assert allowed(service, method.name), f"{service}/{method.name}"
