"""The public API's client, in a process that refuses every model library, against the tiny served stack:
its greedy output is the target's."""

from __future__ import annotations

import json

from inprocess.engine import SpeculativeEngine
from specserve.config import GenerationRequest
from tests.helpers import run_without_model_libraries
from tests.stack import LocalStack

GENERATE_AND_STREAM = """
import json, sys
from specserve_client import SpecServeClient

address, prompt, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
with SpecServeClient(address, timeout_s=60) as client:
    generated = client.generate(prompt, max_tokens=max_tokens, num_speculative_tokens=4)
    chunks = client.stream(prompt, max_tokens=max_tokens, num_speculative_tokens=2)
    streamed = [token_id for chunk in chunks for token_id in chunk.token_ids]
    model = client.info().target_model
    print(json.dumps({"generated": list(generated.token_ids), "streamed": streamed, "model": model}))
"""


def test_the_light_client_calls_a_served_stack(engine: SpeculativeEngine) -> None:
    prompt, max_tokens = "def f(", 24
    reference = engine.generate(GenerationRequest(prompt=prompt, max_tokens=max_tokens, num_speculative_tokens=0))
    with LocalStack() as stack:
        completed = run_without_model_libraries(GENERATE_AND_STREAM, stack.address, prompt, str(max_tokens))
    assert completed.returncode == 0, completed.stderr
    answers = json.loads(completed.stdout.strip().splitlines()[-1])
    assert answers["generated"] == reference.token_ids
    assert answers["streamed"] == reference.token_ids
    assert answers["model"] == "tiny"
