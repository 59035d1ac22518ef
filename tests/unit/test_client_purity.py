"""The public API's client needs no model library: it imports and builds requests in a process that refuses
torch, transformers, numpy, ray and specserve.models (the served call: integration/test_light_client.py)."""

from __future__ import annotations

from orchestrator.generation import generation_request_from_proto
from protos import specserve_pb2 as pb
from specserve.config import GenerationRequest
from specserve.core.types import SamplingParams
from tests.helpers import run_without_model_libraries

BUILD_A_REQUEST = """
from specserve_client import AsyncSpecServeClient, SpecServeClient, build_request
from orchestrator.client import SpecServeClient as SameClient  # the path older code imports

assert SameClient is SpecServeClient
request = build_request(
    messages=[("user", "hi")], max_tokens=8, temperature=0.7, top_p=0.9, seed=3, stop=["\\n"], num_speculative_tokens=2
)
SpecServeClient("127.0.0.1:1", timeout_s=1.0).close()  # a channel connects lazily: no server needed
print(request.SerializeToString().hex())
"""


def test_the_client_builds_requests_without_model_libraries() -> None:
    completed = run_without_model_libraries(BUILD_A_REQUEST)
    assert completed.returncode == 0, completed.stderr
    request = pb.GenerateRequest.FromString(bytes.fromhex(completed.stdout.strip().splitlines()[-1]))
    expected = GenerationRequest(
        messages=(("user", "hi"),), max_tokens=8, sampling=SamplingParams(0.7, 0.9, 0, 3), stop=("\n",),
        num_speculative_tokens=2,
    )  # fmt: skip
    assert generation_request_from_proto(request) == expected  # what the orchestrator reads from it


def test_that_process_refuses_a_model_library() -> None:
    completed = run_without_model_libraries("import specserve.config")  # its ModelConfig is in specserve.models
    assert completed.returncode != 0
    assert "refused in this process: specserve.models" in completed.stderr, completed.stderr
