"""What one round costs on the wire: `python -m specserve.bench.wire [--temperature 0.7]`.

Runs the draft on HumanEval prompts and sizes the Propose response and the Verify request that a
round would send (sparse draft distribution when sampling), against shipping dense [k, vocab] probs.
"""

from __future__ import annotations

import argparse
import statistics

from draft_service.worker import DraftWorker
from protos import specserve_pb2 as pb
from specserve.bench.workloads import humaneval_prompts
from specserve.core.types import SamplingParams
from specserve.models.loading import ModelConfig, load_model
from specserve.models.registry import DEFAULT_DRAFT
from specserve.worker import convert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    draft = load_model(ModelConfig(args.draft, quantization="auto"))
    worker = DraftWorker(draft)
    sampling = SamplingParams(temperature=args.temperature, seed=0)
    sizes, supports = [], []
    for i, text in enumerate(humaneval_prompts(args.num_prompts)):
        prompt = draft.tokenizer(text, add_special_tokens=False)["input_ids"]
        worker.prefill(str(i), prompt, seed=i)
        length = len(prompt)
        for _ in range(args.rounds):
            proposal = worker.propose(str(i), length, [], args.k, sampling)
            response = convert.proposal_to_proto(proposal)
            verify = pb.VerifyRequest(
                session_id=f"{i:032x}", draft_token_ids=proposal.token_ids, draft_probs=response.probs,
                sampling=convert.sampling_to_proto(sampling),
            )  # fmt: skip
            sizes.append((response.ByteSize(), verify.ByteSize()))
            supports.extend(response.probs.row_lengths)
            length += args.k  # as if all were accepted; the sizes do not depend on it
    dense = args.k * draft.vocab_size * 4
    print(f"draft {args.draft}, k={args.k}, temperature {args.temperature}, {len(sizes)} rounds")
    print(f"support per draft position: median {statistics.median(supports):.0f}, max {max(supports)} tokens")
    print(f"Propose response: median {statistics.median(s[0] for s in sizes):.0f} B, max {max(s[0] for s in sizes)} B")
    print(f"Verify request:   median {statistics.median(s[1] for s in sizes):.0f} B, max {max(s[1] for s in sizes)} B")
    print(f"dense float32 probs would be {dense:,} B per round")


if __name__ == "__main__":
    main()
