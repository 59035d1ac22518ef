"""The OpenAI-compatible HTTP API and /metrics on the tiny-model stack, called with the real `openai`
client and plain curl: the same outputs as the gRPC API, OpenAI-shaped errors, counters that move."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specserve.logs import JsonFormatter, RequestIdFilter
from specserve_client import SpecServeClient, build_request
from tests.stack import LocalStack

KEY = "test-key"
PROMPTS = ["def f(", "The quick brown fox", "x = [1, 2, 3]\nfor i in x:\n"]
CURL = shutil.which("curl")


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(http=True, api_key=KEY) as running:
        yield running


@pytest.fixture(scope="module")
def api(stack: LocalStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.http_url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def grpc_client(stack: LocalStack) -> Iterator[SpecServeClient]:
    with SpecServeClient(stack.address, timeout_s=60, api_key=KEY) as client:
        yield client


def curl(*args: str) -> str:
    if CURL is None:
        pytest.skip("the curl binary is not installed")
    done = subprocess.run([CURL, "-sS", *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_models_lists_the_served_target(api: openai.OpenAI) -> None:
    models = api.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert api.models.retrieve("tiny").owned_by == "specserve"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4")


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_completion_equals_the_grpc_api(api: openai.OpenAI, grpc_client: SpecServeClient, stream: bool) -> None:
    for prompt in PROMPTS:  # a fixed k, so that the draft proposes whatever adaptive k has learnt
        expected = grpc_client.generate(prompt, max_tokens=24, num_speculative_tokens=4)
        kwargs = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0,
                  "extra_body": {"num_speculative_tokens": 4}}  # fmt: skip
        if stream:
            chunks = list(api.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            usage = chunks[-1].usage
            assert finish == ["length" if expected.finish_reason == "length" else "stop"]
            assert chunks[-2].speculation["generated_tokens"] == len(expected.token_ids)
        else:
            response = api.completions.create(**kwargs)
            text, usage = response.choices[0].text, response.usage
            assert response.choices[0].finish_reason in ("length", "stop")
            assert response.id.startswith("cmpl-") and response.object == "text_completion"
            assert response.speculation["proposed"] > 0
            assert 0 <= response.speculation["acceptance_rate"] <= 1
        assert text == expected.text, (prompt, stream)
        assert usage.completion_tokens == len(expected.token_ids)
        assert usage.prompt_tokens == expected.stats.prompt_tokens
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_chat_equals_the_grpc_api_with_the_chat_template(
    api: openai.OpenAI, grpc_client: SpecServeClient, stream: bool
) -> None:
    messages = [("system", "You write code."), ("user", "Sort a list")]
    expected = grpc_client.generate(messages=messages, max_tokens=20)
    kwargs = {"model": "tiny", "messages": [{"role": r, "content": c} for r, c in messages], "max_tokens": 20,
              "temperature": 0}  # fmt: skip
    if stream:
        chunks = list(api.chat.completions.create(**kwargs, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason is not None and chunks[-1].usage is None
    else:
        response = api.chat.completions.create(**kwargs)
        assert response.object == "chat.completion" and response.choices[0].message.role == "assistant"
        text = response.choices[0].message.content
        assert response.usage.completion_tokens == len(expected.token_ids)
    assert text == expected.text
    assert expected.stats.prompt_tokens > 10  # the template wrapped the messages


def test_stop_seed_and_top_p(api: openai.OpenAI, grpc_client: SpecServeClient) -> None:
    full = grpc_client.generate("def f(", max_tokens=30).text
    stop = full[5:7]
    cut = api.completions.create(model="tiny", prompt="def f(", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = [
        api.completions.create(model="tiny", prompt="def f(", max_tokens=20, temperature=1.0, top_p=0.9, seed=7)
        for _ in range(2)
    ]
    assert sampled[0].choices[0].text == sampled[1].choices[0].text
    seeded = grpc_client.generate("def f(", max_tokens=20, temperature=1.0, top_p=0.9, seed=7)
    assert sampled[0].choices[0].text == seeded.text  # the same seeded stream through either API


def test_curl_completion_and_stream(stack: LocalStack, grpc_client: SpecServeClient) -> None:
    body = json.dumps({"model": "tiny", "prompt": "def f(", "max_tokens": 16, "temperature": 0})
    url = stack.http_url + "/v1/completions"
    auth = ["-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json"]
    response = json.loads(curl(url, *auth, "-d", body))
    expected = grpc_client.generate("def f(", max_tokens=16).text
    assert response["choices"][0]["text"] == expected
    events = curl("-N", url, *auth, "-d", json.dumps(json.loads(body) | {"stream": True})).split("\n\n")
    assert events[-2] == "data: [DONE]" and events[-1] == ""
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected


BAD_REQUESTS = [
    ({"prompt": "x", "temperature": -1}, "temperature", "temperature must be >= 0"),
    ({"prompt": "x", "top_p": 0}, "top_p", "top_p"),
    ({"prompt": "x", "max_tokens": 100_000}, "max_tokens", "does not fit"),
    ({"prompt": "x", "max_tokens": -1}, None, "max_tokens"),
    ({"prompt": "x", "n": 2}, "n", "n must be 1"),
    ({"prompt": ""}, "prompt", "prompt must be"),
    ({"prompt": "x", "logprobs": 2}, "logprobs", "not supported"),
    ({"prompt": "x", "stop": [""]}, None, "stop"),
    ({"prompt": "x", "temperature": "hot"}, "temperature", "must be a number"),
    ({"prompt": "x" * 600}, "prompt", "context holds"),
]


@pytest.mark.parametrize(("fields", "param", "message"), BAD_REQUESTS)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_requests_get_openai_errors(
    api: openai.OpenAI, fields: dict, param: str | None, message: str, stream: bool
) -> None:
    extra = {k: v for k, v in fields.items() if k != "prompt"}
    with pytest.raises(openai.BadRequestError) as raised:
        api.completions.create(model="tiny", prompt=fields["prompt"], stream=stream, extra_body=extra)
    error = raised.value
    assert error.status_code == 400 and error.type == "invalid_request_error"
    assert message in error.message
    if param is not None:
        assert error.param == param
    assert api.completions.create(model="tiny", prompt="ok", max_tokens=2).choices[0].text is not None


def test_auth_model_and_route_errors(stack: LocalStack, api: openai.OpenAI) -> None:
    bad = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        bad.completions.create(model="tiny", prompt="x", max_tokens=2)
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"
    body, status = curl(stack.http_url + "/v1/models", "-w", "\n%{http_code}").rsplit("\n", 1)
    assert status == "401" and "an API key is required" in json.loads(body)["error"]["message"]
    card = json.loads(curl(stack.http_url + "/v1/models", "-H", f"Authorization: Bearer {KEY}"))["data"][0]
    assert (card["id"], card["draft_model"]) == ("tiny", "tiny-draft")
    assert card["speculation"] == {"adaptive": True, "num_speculative_tokens": 4, "max_speculative_tokens": 8}
    with pytest.raises(openai.NotFoundError) as missing:
        api.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 600}])
    assert raised.value.param == "messages" and "context holds" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
    assert raised.value.param == "messages"
    auth = ["-H", f"Authorization: Bearer {KEY}", "-w", "\n%{http_code}"]
    body, status = curl(stack.http_url + "/v1/completions", *auth, "-d", "{not json").rsplit("\n", 1)
    assert status == "400" and json.loads(body)["error"]["type"] == "invalid_request_error"
    body, status = curl(stack.http_url + "/v1/nothing", *auth).rsplit("\n", 1)
    assert status == "404" and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


def scrape(stack: LocalStack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = curl(stack.http_url + "/metrics")  # open without the key: scrapers carry none
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_parse_and_move_as_requests_are_served(
    stack: LocalStack, api: openai.OpenAI, grpc_client: SpecServeClient
) -> None:
    before = scrape(stack)
    k = {"num_speculative_tokens": 4}  # a fixed k: adaptive k may choose target-only, which proposes nothing
    response = api.completions.create(model="tiny", prompt="def f(", max_tokens=12, temperature=0, extra_body=k)
    grpc_client.generate("def f(", max_tokens=12, **k)
    with pytest.raises(openai.BadRequestError):
        api.completions.create(model="tiny", prompt="x", temperature=-1)
    after = scrape(stack)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("specserve_requests_total", api="http", status="ok") == 1
    assert moved("specserve_requests_total", api="grpc", status="ok") == 1
    assert moved("specserve_requests_total", api="http", status="invalid_argument") == 1
    assert moved("specserve_generation_tokens_total") == response.usage.completion_tokens + 12
    for histogram in ("specserve_time_to_first_token_seconds", "specserve_time_per_output_token_seconds",
                      "specserve_request_acceptance_rate", "specserve_request_tokens_per_second"):  # fmt: skip
        assert moved(histogram + "_count") == 2, histogram
    rounds = response.speculation["rounds"]
    assert moved("specserve_accepted_tokens_per_round_count") >= rounds
    assert moved("specserve_speculation_length_count") >= rounds
    assert moved("specserve_rpc_duration_seconds_count", service="TargetService", method="Verify", code="OK") >= rounds
    assert moved("specserve_rpc_duration_seconds_count", service="DraftService", method="Prefill", code="OK") == 2
    sessions = {labels for name, labels in after if name == "specserve_replica_sessions"}
    assert {dict(labels)["role"] for labels in sessions} == {"target", "draft"}
    assert ("specserve_requests_queued", ()) in after and ("specserve_requests_running", ()) in after


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(JsonFormatter())
        self.addFilter(RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_request_ids_reach_the_logs_of_all_three_services(
    stack: LocalStack, api: openai.OpenAI, grpc_client: SpecServeClient
) -> None:
    handler, root = _Lines(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    k = {"num_speculative_tokens": 4}  # a fixed k: at adaptive k = 0 the draft hears nothing of a request
    try:
        raw = api.completions.with_raw_response.create(
            model="tiny", prompt="def f(", max_tokens=8, extra_headers={"X-Request-Id": "http-req-1"}, extra_body=k
        )
        grpc_client.stub.Generate(
            build_request("def f(", max_tokens=8, num_speculative_tokens=4), metadata=[("x-request-id", "grpc-req-1")]
        )
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert raw.headers["x-request-id"] == "http-req-1" and raw.parse().id == "cmpl-http-req-1"
    entries = [json.loads(line) for line in handler.lines]  # every line is one JSON object
    for request_id in ("http-req-1", "grpc-req-1"):
        mine = [e for e in entries if e.get("request_id") == request_id]
        methods = {e.get("rpc_method") for e in mine}
        assert {"/specserve.v1.TargetService/Prefill", "/specserve.v1.DraftService/Prefill",
                "/specserve.v1.TargetService/Verify"} <= methods, (request_id, methods)  # a line per round call
        assert any(e["logger"] == "orchestrator.metrics" and e["message"].startswith("request ok") for e in mine)
    assert "/specserve.v1.Orchestrator/Generate" in {
        e.get("rpc_method") for e in entries if e.get("request_id") == "grpc-req-1"
    }


def test_overload_is_429() -> None:
    limits = {"max_concurrent_requests": 1, "max_queued_requests": 0}
    with LocalStack(http=True, orchestrator=limits) as small:
        client = openai.OpenAI(base_url=small.http_url + "/v1", api_key="x", max_retries=0)
        held = client.completions.create(
            model="tiny", prompt="def f(", max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(held))  # the first request now holds the only slot
        with pytest.raises(openai.RateLimitError) as raised:
            client.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert raised.value.status_code == 429 and "overloaded" in raised.value.message
        assert int(raised.value.response.headers["retry-after"]) >= 1
        held.close()  # the client goes away mid-stream: its sessions are released, the request counted
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            metrics = scrape(small)
            sessions = [v for (name, _), v in metrics.items() if name == "specserve_replica_sessions"]
            cancelled = metrics.get(("specserve_requests_total", (("api", "http"), ("status", "cancelled"))), 0)
            if cancelled == 1 and sessions and not any(sessions):
                break
            time.sleep(0.1)
        assert cancelled == 1 and sessions and not any(sessions), (cancelled, sessions)
        assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices  # the slot is free again
