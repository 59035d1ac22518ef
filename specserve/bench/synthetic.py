"""Synthetic benchmark: random-weight models of real shapes built on the device, and a draft whose
acceptance is controlled, to measure throughput against acceptance, k and concurrency where the real
weights cannot go (a GPU machine with no registry). `python -m specserve.bench.synthetic --help`.

The draft runs its real forward passes (so its cost is real) but proposes, with probability alpha, the
token the target will choose (its greedy continuation, computed once beforehand) and another token
otherwise; verification is the real one, so outputs still equal target-only.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from draft_service.worker import DraftWorker, ProposeCall
from specserve.core.loop import SpeculativeDecoder, StopConditions
from specserve.core.types import Proposal, SamplingParams
from specserve.models.loading import LoadedModel
from target_service.worker import TargetWorker, VerifyCall

# hidden, layers, heads, kv heads, intermediate: the published Qwen2.5 configurations
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 2, 4, 2, 128),
    "tiny-draft": (64, 1, 4, 2, 128),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944),
}
VOCAB = {"tiny": 260, "tiny-draft": 260}
QWEN_VOCAB = 151936


def build(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    hidden, layers, heads, kv_heads, intermediate = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=VOCAB.get(shape, QWEN_VOCAB), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
        max_position_embeddings=4096, tie_word_embeddings=hidden < 1024,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    return LoadedModel(shape, model, None, device, dtype, 4096, frozenset(), 0.0)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Point:
    alpha: float
    k: int
    concurrency: int


def target_only_continuations(target: TargetWorker, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The target's greedy continuation of every prompt (batched, as the measured runs are)."""
    return lockstep(target, None, prompts, 0, max_tokens, alpha=0.0, references=None)[0]


def lockstep(
    target: TargetWorker,
    draft: DraftWorker | None,
    prompts: list[list[int]],
    k: int,
    max_tokens: int,
    alpha: float,
    references: list[list[int]] | None,
    seed: int = 0,
) -> tuple[list[list[int]], float, int, int]:
    """Every prompt as a session, all advanced together one round at a time (one batched draft step per
    draft token, one batched target pass per round). Returns (outputs, seconds, proposed, accepted)."""
    rng = random.Random(seed)
    sampling = SamplingParams()
    vocab = target.loaded.vocab_size
    decoders, commits = {}, {}
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        sid = f"s{i}"
        target.prefill(sid, prompt)
        if draft is not None:
            draft.prefill(sid, prompt)
        decoders[sid] = SpeculativeDecoder(None, None, num_prompt_tokens=len(prompt), k=k, sampling=sampling,
                                           stop=StopConditions(max_tokens), max_context=4096)  # fmt: skip
        commits[sid] = (len(prompt), [])
    proposed = accepted = 0
    while active := {sid: n for sid, d in decoders.items() if (n := d.next_k()) is not None}:
        proposals = {sid: Proposal([]) for sid in active}
        drafting = [sid for sid, n in active.items() if n > 0]
        if draft is not None and drafting:
            calls = [ProposeCall(sid, *commits[sid], active[sid], sampling) for sid in drafting]
            for call, drafted in zip(calls, draft.propose_batch(calls)):
                assert not isinstance(drafted, Exception), drafted
                if references is not None:  # the controlled draft; without references, the draft's own tokens
                    drafted = _controlled(call.session_id, drafted, decoders, references, alpha, rng, vocab, draft)
                proposals[call.session_id] = drafted
        verdicts = target.verify_batch([VerifyCall(sid, proposals[sid], sampling) for sid in active])
        for sid, verdict in zip(active, verdicts):
            assert not isinstance(verdict, Exception), verdict
            decoder = decoders[sid]
            commits[sid] = (decoder.context_length + verdict.num_accepted, verdict.token_ids[-1:])
            decoder.apply(proposals[sid], verdict, 0.0, 0.0)
            proposed, accepted = proposed + len(proposals[sid].token_ids), accepted + verdict.num_accepted
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    for sid in decoders:
        target.release(sid)
        if draft is not None:
            draft.release(sid)
    return [decoders[f"s{i}"].result.token_ids for i in range(len(prompts))], seconds, proposed, accepted


def _controlled(
    sid: str,
    drafted: Proposal,
    decoders: dict[str, SpeculativeDecoder],
    references: list[list[int]],
    alpha: float,
    rng: random.Random,
    vocab: int,
    draft: DraftWorker,
) -> Proposal:
    """Replace the random draft's tokens: the target's own next token with probability alpha, another
    token otherwise; the draft's session is told, so its next commit rolls back consistently."""
    reference = references[int(sid[1:])]
    done = len(decoders[sid].result.token_ids)
    tokens = []
    for j in range(len(drafted.token_ids)):
        truth = reference[done + j] if done + j < len(reference) else 0
        tokens.append(truth if rng.random() < alpha else (truth + 1) % vocab)
    sequence = draft.sessions.get(sid).sequence
    sequence.token_ids[len(sequence.token_ids) - len(tokens) :] = tokens
    return Proposal(tokens)


def measure(
    target: TargetWorker, draft: DraftWorker, points: list[Point], prompt_len: int, max_tokens: int
) -> list[dict]:
    rows = []
    vocab = target.loaded.vocab_size
    for concurrency in sorted({p.concurrency for p in points}):
        prompts = [[(7 * i + 13 * j) % vocab for j in range(prompt_len)] for i in range(concurrency)]
        references = target_only_continuations(target, prompts, max_tokens)
        _, base_s, _, _ = lockstep(target, None, prompts, 0, max_tokens, 0.0, None)
        base = concurrency * max_tokens / base_s
        rows.append({"alpha": None, "k": 0, "concurrency": concurrency, "tokens_per_second": base, "speedup": 1.0})
        for point in (p for p in points if p.concurrency == concurrency and p.k > 0):
            outputs, seconds, proposed, accepted = lockstep(
                target, draft, prompts, point.k, max_tokens, point.alpha, references
            )
            rate = concurrency * max_tokens / seconds
            rows.append({
                "alpha": point.alpha, "k": point.k, "concurrency": concurrency, "tokens_per_second": rate,
                "speedup": rate / base, "acceptance": accepted / proposed if proposed else 0.0,
                "identical_to_target_only": sum(o == r for o, r in zip(outputs, references)),
            })  # fmt: skip
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [
        "| concurrency | alpha | k | tok/s | speedup | acceptance | identical |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        alpha = "" if r["alpha"] is None else f"{r['alpha']:.2f}"
        acceptance = f"{r['acceptance']:.2f}" if "acceptance" in r else ""
        identical = f"{r['identical_to_target_only']}/{r['concurrency']}" if "acceptance" in r else ""
        lines.append(f"| {r['concurrency']} | {alpha} | {r['k']} | {r['tokens_per_second']:.1f} | "
                     f"{r['speedup']:.2f}x | {acceptance} | {identical} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.synthetic", description=__doc__)
    parser.add_argument("--target", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--draft", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.6, 0.8, 0.95])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target = TargetWorker(build(args.target, device, dtype, seed=1), max_sessions=1024)
    draft = DraftWorker(build(args.draft, device, dtype, seed=2), max_sessions=1024)
    points = [Point(a, k, c) for c in args.concurrency for a in args.alphas for k in args.ks]
    print(f"# {args.target} target + {args.draft} draft, random weights, {args.dtype} on {device}, "
          f"prompt {args.prompt_len} tokens, {args.max_tokens} generated per session")  # fmt: skip
    print(format_rows(measure(target, draft, points, args.prompt_len, args.max_tokens)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
