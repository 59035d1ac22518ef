"""OpenAI request parsing and error shapes, the metrics export of a request's stats, and JSON log lines:
the pieces of the HTTP API and observability that need no server."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.metrics import Metrics, ReplicaState, ServingState
from orchestrator.openai_api import ApiError, Shape, error_for, parse
from specserve.core.stats import SpeculationStats
from specserve.logs import JsonFormatter, RequestIdFilter, bind_request_id
from specserve.rpc import OverloadedError, UnavailableError


def room(request: object) -> int:
    return 100


def test_completion_bodies_become_generation_requests() -> None:
    parsed = parse({"prompt": "hi", "max_tokens": 5, "temperature": 0, "stop": "\n", "seed": 3}, False, room)
    r = parsed.request
    assert (r.prompt, r.max_tokens, r.stop, r.sampling.greedy, r.sampling.seed) == ("hi", 5, ("\n",), True, 3)
    assert not parsed.stream and not parsed.chat
    assert parse({"prompt": ["hi"]}, False, room).request.prompt == "hi"  # a batch of one
    assert parse({"prompt": [1, 2, 3]}, False, room).request.prompt_token_ids == (1, 2, 3)
    defaults = parse({"prompt": "hi"}, False, room).request
    assert defaults.max_tokens == 16 and defaults.sampling.temperature == 1.0  # OpenAI's defaults
    extended = parse({"prompt": "hi", "top_k": 5, "num_speculative_tokens": 2, "ignore_eos": True}, False, room)
    assert (extended.request.sampling.top_k, extended.request.num_speculative_tokens) == (5, 2)


def test_chat_bodies_use_messages_and_fill_max_tokens_from_the_room_left() -> None:
    body = {"messages": [{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    parsed = parse(body, True, room)
    assert parsed.request.messages == (("system", "be brief"), ("user", "ab"))
    assert parsed.request.max_tokens == 100 and parsed.stream and parsed.include_usage
    assert parse(body | {"max_completion_tokens": 7}, True, room).request.max_tokens == 7


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "n": 3}, "n"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "logit_bias": {"1": 2}}, "logit_bias"),
        ({"prompt": "x", "temperature": "warm"}, "temperature"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "stop": [1]}, "stop"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": "x", "top_p": 2.0}, "top_p"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({}, "prompt"),
    ],
)
def test_bad_bodies_are_400_naming_the_parameter(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as raised:
        parse(body, False, room)
    assert raised.value.status == 400 and raised.value.param == param
    assert set(raised.value.body()["error"]) == {"message", "type", "param", "code"}


def test_errors_map_to_openai_statuses() -> None:
    cases = [
        (ValueError("max_tokens 9 does not fit"), 400, "invalid_request_error"),
        (OverloadedError("overloaded", 1.0), 429, "rate_limit_error"),
        (UnavailableError("no target replica"), 503, "service_unavailable_error"),
        (RuntimeError("a bug"), 500, "server_error"),
    ]
    for error, status, kind in cases:
        api_error = error_for(error, ("max_tokens",))
        assert (api_error.status, api_error.body()["error"]["type"]) == (status, kind), error
    assert error_for(ValueError("max_tokens 9 does not fit"), ("max_tokens",)).param == "max_tokens"
    assert "a bug" not in error_for(RuntimeError("a bug")).message  # internals stay in the server's log


def test_shapes_follow_openai() -> None:
    stats = SpeculationStats(num_prompt_tokens=3, num_generated=2, num_proposed=4, num_accepted=1, num_rounds=2)
    chat = Shape.of("abc", "tiny", chat=True)
    response = chat.response("hi", "eos", stats)
    assert response["id"] == "chatcmpl-abc" and response["object"] == "chat.completion"
    assert response["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert response["choices"][0]["finish_reason"] == "stop"
    assert response["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert response["speculation"]["acceptance_rate"] == 0.25
    assert chat.chunk(None)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat.chunk("", "length")["choices"][0] == {"index": 0, "logprobs": None, "finish_reason": "length",
                                                      "delta": {}}  # fmt: skip
    text = Shape.of("abc", "tiny", chat=False)
    assert text.chunk("x")["object"] == "text_completion" and text.chunk("x")["choices"][0]["text"] == "x"
    assert text.usage_chunk(stats)["choices"] == []


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = text_string_to_metric_families(metrics.exposition().decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_a_request_is_exported_round_by_round_and_at_its_end() -> None:
    metrics = Metrics()
    metrics.watch(lambda: ServingState(2, 5, [ReplicaState("target", "t:1", "serving", 2)]))
    tracker = metrics.track("http")
    stats = SpeculationStats()
    for k, accepted in [(4, 4), (4, 1)]:
        stats.observe_round(k, accepted, 0.01, 0.01)
        stats.observe_emitted(accepted + 1, 0.1)
        tracker.observe_chunk(accepted + 1, stats)
    stats.num_prompt_tokens = 7
    tracker.finish(None, stats)
    metrics.track("grpc").finish(ValueError("bad"))
    metrics.track("grpc").finish(asyncio.CancelledError())
    metrics.observe_rpc("/specserve.v1.TargetService/Verify", grpc.StatusCode.OK, 0.003)
    got = samples(metrics)
    assert got["specserve_requests_total", (("api", "http"), ("status", "ok"))] == 1
    assert got["specserve_requests_total", (("api", "grpc"), ("status", "invalid_argument"))] == 1
    assert got["specserve_requests_total", (("api", "grpc"), ("status", "cancelled"))] == 1
    assert got["specserve_generation_tokens_total", ()] == 7 and got["specserve_prompt_tokens_total", ()] == 7
    assert got["specserve_accepted_tokens_per_round_sum", ()] == 5
    assert got["specserve_accepted_tokens_per_round_count", ()] == 2
    assert got["specserve_speculation_length_bucket", (("le", "4.0"),)] == 2
    assert got["specserve_request_acceptance_rate_sum", ()] == 5 / 8
    assert got["specserve_time_to_first_token_seconds_count", ()] == 1
    assert got["specserve_rpc_duration_seconds_count", (("code", "OK"), ("method", "Verify"),
                                                        ("service", "TargetService"))] == 1  # fmt: skip
    assert got["specserve_requests_queued", ()] == 5 and got["specserve_requests_running", ()] == 2
    assert got["specserve_replica_sessions", (("replica", "t:1"), ("role", "target"))] == 2


def test_drafts_are_counted_by_the_drafter_that_made_them() -> None:
    metrics = Metrics()
    tracker = metrics.track("grpc")
    stats = SpeculationStats()
    for k, accepted, source in [(4, 3, "ngram"), (4, 1, "model"), (0, 0, ""), (2, 2, "ngram")]:
        stats.observe_round(k, accepted, 0.01, 0.01, source)
        stats.observe_emitted(accepted + 1, 0.1)
        tracker.observe_chunk(accepted + 1, stats)
    tracker.finish(None, stats)
    got = samples(metrics)
    assert got["specserve_draft_tokens_proposed_total", (("source", "ngram"),)] == 6
    assert got["specserve_draft_tokens_accepted_total", (("source", "ngram"),)] == 5
    assert got["specserve_draft_tokens_proposed_total", (("source", "model"),)] == 4
    assert got["specserve_draft_tokens_accepted_total", (("source", "model"),)] == 1
    assert ("specserve_draft_tokens_proposed_total", (("source", ""),)) not in got


def test_json_log_lines_carry_the_request_id() -> None:
    record = logging.LogRecord("orchestrator.x", logging.INFO, __file__, 1, "done %d", (3,), None)
    record.rpc_method = "/specserve.v1.TargetService/Verify"

    async def in_a_request() -> None:
        bind_request_id("req-7")
        RequestIdFilter().filter(record)

    asyncio.run(in_a_request())
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "req-7" and line["message"] == "done 3" and line["level"] == "INFO"
    assert line["rpc_method"] == "/specserve.v1.TargetService/Verify"
    assert bind_request_id("bad\nid") != "bad\nid"  # ids that would break log lines are replaced


def test_the_grafana_dashboard_reads_only_exported_metrics() -> None:
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana" / "specserve.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bspecserve_[a-z_]+", expr)}
    metrics = Metrics()
    metrics.watch(lambda: ServingState(0, 0, [ReplicaState("target", "t:1", "serving", 0)]))
    metrics.track("http").finish(None, SpeculationStats(num_generated=2, num_proposed=1, num_rounds=1))
    metrics.observe_rpc("/specserve.v1.TargetService/Verify", grpc.StatusCode.OK, 0.001)
    exported = {name for name, _ in samples(metrics)}
    assert used and used <= exported, used - exported
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_demo_prints_a_curl_line_for_its_http_api(tmp_path: object) -> None:
    import shlex
    from pathlib import Path

    from deploy.config import load_config
    from specserve.cli import _curl_line

    config = load_config(None, {"orchestrator.http_port": 8123, "target.model.name": "tiny"})
    words = shlex.split(_curl_line(config))
    assert words[:3] == ["curl", "-s", "http://127.0.0.1:8123/v1/completions"]
    assert json.loads(words[-1])["model"] == "tiny"
    key_file = Path(str(tmp_path)) / "key"
    key_file.write_text("s3cret\n")
    secured = load_config(None, {"orchestrator.http_port": 8123, "security.api_key_file": str(key_file)})
    line = _curl_line(secured)
    assert "Authorization: Bearer" in line and "s3cret" not in line  # the key is read where the server read it
