"""Synthetic benchmark: random-weight models of real shapes built on the device, and a draft whose
acceptance is controlled, to measure throughput against acceptance, k and concurrency where the real
weights cannot go (a GPU machine with no registry). `python -m specserve.bench.synthetic --help`.

The draft runs its real forward passes (so its cost is real) but proposes, with probability alpha, the
token the target will choose (its greedy continuation, computed once beforehand) and another token
otherwise; verification is the real one, so outputs still equal target-only, up to near-ties where a
bfloat16 verification pass rounds differently from a decode step (checked: `near_tie_partings`). The
target is built predictable (`build`) so that such ties are rare: after a parting the reference is no
longer the target's continuation, and measured acceptance falls below alpha (the table reports both).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from draft_service.worker import DraftWorker, ProposeCall
from specserve.bench.lossless import ReferenceDecoder, first_divergence
from specserve.core.loop import SpeculativeDecoder, StopConditions
from specserve.core.types import Proposal, SamplingParams
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence
from specserve.models.slot_cache import SlotCacheConfig, SlotPool, SlotSequence
from specserve.models.step_graphs import StepGraphs
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


EMBEDDING_RMS = 100.0  # the token's embedding outweighs 28 random layers' additions (about 5 rms together)


def build(
    shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0, predictable: bool = False
) -> LoadedModel:
    """A random-weight Qwen2 model of the shape. `predictable`: its greedy next token is a fixed random
    permutation of the current one, by a wide margin. Plain random weights give near-flat logits, whose top
    two lie within bfloat16's rounding: on an H200 a verification pass and a decode step parted within a
    few tokens in every session, the controlled draft's reference was no longer the target's continuation,
    and acceptance read 0.01-0.06 at every alpha. Each pass still does the work of the real shape."""
    hidden, layers, heads, kv_heads, intermediate = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=VOCAB.get(shape, QWEN_VOCAB), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
        max_position_embeddings=4096, tie_word_embeddings=hidden < 1024 and not predictable,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).eval()
    if predictable:
        _point_to_successors(model, seed)
    model = model.to(dtype)
    return LoadedModel(shape, model, None, device, dtype, 4096, frozenset(), 0.0)  # type: ignore[arg-type]


@torch.no_grad()
def _point_to_successors(model: Qwen2ForCausalLM, seed: int) -> None:
    """Scale the embeddings up until the last hidden state is about the current token's embedding, and make
    the output row of each token's successor that embedding's direction: the successor's logit is then about
    sqrt(hidden), the others about 1."""
    embedding = model.model.embed_tokens.weight
    successor = torch.randperm(embedding.shape[0], generator=torch.Generator().manual_seed(seed))
    directions = embedding / embedding.norm(dim=-1, keepdim=True)
    model.lm_head.weight[successor.to(embedding.device)] = directions
    embedding.mul_(EMBEDDING_RMS / embedding.pow(2).mean().sqrt())


@dataclass(frozen=True, slots=True)
class Point:
    alpha: float
    k: int
    concurrency: int
    draft_cache: str = "slots"  # a key of the drafts measured: "slots" (pool + graphed steps) or "growing"


def drafts_of(loaded: LoadedModel, caches: list[str]) -> dict[str, DraftWorker]:
    """One draft worker per cache layout over the same model: "slots" (a slot pool, CUDA graphs where
    there is CUDA) or "growing" (a growing cache per session, eager passes)."""
    layouts = {"slots": SlotCacheConfig(enabled=True), "growing": SlotCacheConfig(enabled=False)}
    return {cache: DraftWorker(loaded, max_sessions=1024, slot_cache=layouts[cache]) for cache in caches}


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
    phases: dict[str, float] | None = None,
) -> tuple[list[list[int]], float, int, int]:
    """Every prompt as a session, all advanced together one round at a time (one batched draft step per
    draft token, one batched target pass per round). Returns (outputs, seconds, proposed, accepted);
    `phases` gets the seconds spent drafting, verifying and in rounds (each phase ends reading its results)."""
    phases = {} if phases is None else phases
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
        phases["rounds"] = phases.get("rounds", 0) + 1
        drafted_at = time.perf_counter()
        proposals = {sid: Proposal([]) for sid in active}
        drafting = [sid for sid, n in active.items() if n > 0]
        if draft is not None and drafting:
            calls = [ProposeCall(sid, *commits[sid], active[sid], sampling) for sid in drafting]
            for call, drafted in zip(calls, draft.propose_batch(calls)):
                assert not isinstance(drafted, Exception), drafted
                if references is not None:  # the controlled draft; without references, the draft's own tokens
                    drafted = _controlled(call.session_id, drafted, decoders, references, alpha, rng, vocab, draft)
                proposals[call.session_id] = drafted
        verified_at = time.perf_counter()
        verdicts = target.verify_batch([VerifyCall(sid, proposals[sid], sampling) for sid in active])
        phases["draft_s"] = phases.get("draft_s", 0.0) + verified_at - drafted_at
        phases["verify_s"] = phases.get("verify_s", 0.0) + time.perf_counter() - verified_at
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


TIE_CHECKS = 4  # divergent outputs checked per point: each check decodes its prompt one token per pass


def measure(
    target: TargetWorker, drafts: dict[str, DraftWorker], points: list[Point], prompt_len: int, max_tokens: int
) -> Iterator[dict]:
    """Rows as they are measured (a run cut short by a time limit keeps what it printed)."""
    vocab = target.loaded.vocab_size
    reference_decoder = ReferenceDecoder(target.loaded)
    for concurrency in sorted({p.concurrency for p in points}):
        prompts = [[(7 * i + 13 * j) % vocab for j in range(prompt_len)] for i in range(concurrency)]
        references = target_only_continuations(target, prompts, max_tokens)
        # warm-up, unmeasured: each pass shape's first run (lazy kernel loading, kernel choice, graph capture).
        # In the first H200 run with graphed drafts only k = 2 was warmed, and each point's first row paid it.
        warm_tokens = min(16, max_tokens)
        lockstep(target, None, prompts, 0, warm_tokens, 0.0, None)
        for draft in drafts.values():
            for k in sorted({p.k for p in points if p.concurrency == concurrency and p.k > 0}):
                lockstep(target, draft, prompts, k, warm_tokens, 0.8, references)
        phases = {}
        _, base_s, _, _ = lockstep(target, None, prompts, 0, max_tokens, 0.0, None, 0, phases)
        base = concurrency * max_tokens / base_s
        yield {"alpha": None, "k": 0, "concurrency": concurrency, "tokens_per_second": base, "speedup": 1.0,
               "verify_ms_per_round": 1000 * phases["verify_s"] / phases["rounds"]}  # fmt: skip
        for point in (p for p in points if p.concurrency == concurrency and p.k > 0):
            phases: dict[str, float] = {}
            outputs, seconds, proposed, accepted = lockstep(
                target, drafts[point.draft_cache], prompts, point.k, max_tokens, point.alpha, references, 0, phases
            )
            rate = concurrency * max_tokens / seconds
            round_ms = {
                f"{name}_ms_per_round": 1000 * phases[f"{name}_s"] / phases["rounds"] for name in ("draft", "verify")
            }
            yield {
                "alpha": point.alpha, "k": point.k, "concurrency": concurrency, "draft_cache": point.draft_cache,
                "tokens_per_second": rate, "speedup": rate / base,
                "acceptance": accepted / proposed if proposed else 0.0, **round_ms,
                "identical_to_target_only": sum(o == r for o, r in zip(outputs, references)),
                **near_tie_partings(reference_decoder, prompts, references, outputs),
            }  # fmt: skip


def near_tie_partings(
    decoder: ReferenceDecoder, prompts: list[list[int]], references: list[list[int]], outputs: list[list[int]]
) -> dict[str, int]:
    """Of the first TIE_CHECKS outputs that part from target-only's, how many part at a near-tie."""
    parted = [i for i, (o, r) in enumerate(zip(outputs, references)) if o != r][:TIE_CHECKS]
    ties = 0
    for i in parted:
        divergence = first_divergence(decoder, prompts[i], references[i], outputs[i])
        ties += divergence is not None and divergence.near_tie
    return {"divergences_checked": len(parted), "near_ties": ties}


def sync_report(target: TargetWorker, draft: DraftWorker, prompt_len: int) -> Counter[str]:
    """Where the decode loop makes the host wait for the device: CUDA's sync debug mode warns at every
    synchronising call; counted per source line over a few rounds of two sessions at k = 4 (no-op on CPU)."""
    vocab = target.loaded.vocab_size
    prompts = [[(3 * i + 5 * j) % vocab for j in range(prompt_len)] for i in range(2)]
    references = target_only_continuations(target, prompts, 8)
    cuda = target.loaded.device.type == "cuda"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            lockstep(target, draft, prompts, 4, 8, 0.8, references)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    where = (f"{Path(w.filename).parent.name}/{Path(w.filename).name}:{w.lineno}" for w in caught
             if "synchroniz" in str(w.message))  # fmt: skip
    return Counter(where)


def draft_step_ms(draft: DraftWorker, batch: int, prompt_len: int, steps: int = 8, repeats: int = 3) -> float:
    """Milliseconds per batched draft step of `batch` sessions (each proposing `steps` tokens per call; the
    best of `repeats` calls after one unmeasured)."""
    vocab, greedy = draft.loaded.vocab_size, SamplingParams()
    for i in range(batch):
        draft.prefill(f"t{i}", [(5 * i + 3 * j) % vocab for j in range(prompt_len)])
    best = _best_seconds(
        lambda repeat: draft.propose_batch(
            [ProposeCall(f"t{i}", prompt_len, [repeat], steps, greedy) for i in range(batch)]
        ),
        repeats,
    )
    for i in range(batch):
        draft.release(f"t{i}")
    return 1000 * best / steps


def verify_ms(target: TargetWorker, batch: int, window: int, prompt_len: int, repeats: int = 3) -> float:
    """Milliseconds per batched target pass over `window` tokens of each of `batch` sessions (window 1: a
    target-only step; k + 1: a verification), the greedy verdicts included; the best of `repeats` passes
    after one unmeasured. The drafts are arbitrary tokens, so the predictable target rejects nearly all and
    the sessions stay near `prompt_len` tokens."""
    vocab, greedy = target.loaded.vocab_size, SamplingParams()
    for i in range(batch):
        target.prefill(f"w{i}", [(7 * i + 3 * j) % vocab for j in range(prompt_len)])
    best = _best_seconds(
        lambda repeat: target.verify_batch(
            [VerifyCall(f"w{i}", Proposal([(repeat + j) % vocab for j in range(window - 1)]), greedy)
             for i in range(batch)]  # fmt: skip
        ),
        repeats,
    )
    for i in range(batch):
        target.release(f"w{i}")
    return 1000 * best


def _best_seconds(run: Callable[[int], object], repeats: int) -> float:
    """The fastest of `repeats` calls run(1..repeats), after run(0) unmeasured (warm-up), each to the device's
    end of work."""
    best = float("inf")
    for repeat in range(repeats + 1):
        started = time.perf_counter()
        run(repeat)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started) if repeat else best
    return best


def check_draft_steps(loaded: LoadedModel, batch: int, prompt_len: int, steps: int = 8) -> dict[str, float]:
    """The draft's steps over a slot pool, graphed, against the same steps run eagerly and against growing
    caches, over `steps` greedy steps of `batch` sessions: the largest logit difference of each, the logits'
    scale, and how often the graphed step's argmax is the growing cache's. (The target's verification keeps
    outputs exact whatever the draft computes, so a broken draft step would only show as lost acceptance,
    which the controlled draft here hides: this is the check.)"""
    model, decoder, vocab = loaded.model, loaded.decoder, loaded.vocab_size
    assert decoder is not None, "the lean decoder does not support this draft"
    pool = SlotPool(model, SlotCacheConfig(enabled=True, slots=2 * batch, tokens_per_slot=prompt_len + steps + 1))
    graphed, eager = StepGraphs(model, pool, cuda_graphs=True), StepGraphs(model, pool, cuda_graphs=False)
    prompts = [[(11 * i + 7 * j) % vocab for j in range(prompt_len)] for i in range(batch)]
    a, b = ([SlotSequence(model, p, decoder, pool, pool.acquire()) for p in prompts] for _ in range(2))  # type: ignore[arg-type]
    growing = [CachedSequence(model, p, decoder) for p in prompts]
    for sequence in [*a, *b, *growing]:
        sequence.prefill()
    result = {"graphed_vs_eager": 0.0, "slots_vs_growing": 0.0, "logit_rms": 0.0, "argmax_agreement": 0.0}
    for _ in range(steps):
        out = graphed.step(a)
        graphed_logits = out.logits.float().clone()
        eager_logits = eager.step(b).logits.float()
        growing_logits = torch.stack([s.feed(1)[-1] for s in growing]).float()
        result["graphed_vs_eager"] = max(result["graphed_vs_eager"], float((graphed_logits - eager_logits).abs().max()))
        result["slots_vs_growing"] = max(
            result["slots_vs_growing"], float((graphed_logits - growing_logits).abs().max())
        )
        result["logit_rms"] = float(growing_logits.pow(2).mean().sqrt())
        agreed = sum(i == j for i, j in zip(out.greedy_ids, growing_logits.argmax(-1).tolist()))
        result["argmax_agreement"] += agreed / (batch * steps)
        for group in (a, b, growing):  # all three continue with the graphed step's choices
            for sequence, token_id in zip(group, out.greedy_ids):
                sequence.token_ids.append(token_id)
    return result


TABLE_HEADER = (
    "| concurrency | alpha | k | draft cache | tok/s | speedup | acceptance | draft / verify ms per round "
    "| identical | near-tie partings |\n|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"
)


def format_row(r: dict) -> str:
    alpha = "" if r["alpha"] is None else f"{r['alpha']:.2f}"
    acceptance = f"{r['acceptance']:.2f}" if "acceptance" in r else ""
    identical = f"{r['identical_to_target_only']}/{r['concurrency']}" if "acceptance" in r else ""
    ties = f"{r['near_ties']}/{r['divergences_checked']}" if r.get("divergences_checked") else ""
    phases = f"{r.get('draft_ms_per_round', 0.0):.1f} / {r['verify_ms_per_round']:.1f}"
    return (f"| {r['concurrency']} | {alpha} | {r['k']} | {r.get('draft_cache', '')} | {r['tokens_per_second']:.1f} | "
            f"{r['speedup']:.2f}x | {acceptance} | {phases} | {identical} | {ties} |")  # fmt: skip


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
    parser.add_argument(
        "--draft-caches",
        nargs="+",
        default=["slots"],
        choices=["slots", "growing"],
        help="draft cache layouts to measure (the first at every k, the others at --compare-k)",
    )
    parser.add_argument("--compare-k", type=int, default=4)
    parser.add_argument("--step-times", type=int, nargs="*", default=[],
                        help="also time one draft step per cache layout at these batch sizes")  # fmt: skip
    parser.add_argument("--verify-times", type=int, nargs="*", default=[],
                        help="also time target passes of windows 1, 3, 5 and 9 at these batch sizes")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--check-draft-steps", type=int, metavar="BATCH", default=0,
                        help="compare graphed draft steps with eager ones and growing caches")  # fmt: skip
    parser.add_argument("--sync-report", action="store_true", help="list where decoding waits for the device")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target = TargetWorker(build(args.target, device, dtype, seed=1, predictable=True), max_sessions=1024)
    drafts = drafts_of(build(args.draft, device, dtype, seed=2), args.draft_caches)
    first, *others = args.draft_caches
    points = [Point(a, k, c, first) for c in args.concurrency for a in args.alphas for k in args.ks]
    points += [Point(a, args.compare_k, c, cache) for cache in others for c in args.concurrency for a in args.alphas]
    print(f"# {args.target} target + {args.draft} draft, random weights, {args.dtype} on {device}, "
          f"prompt {args.prompt_len} tokens, {args.max_tokens} generated per session")  # fmt: skip
    for batch in args.step_times:
        times = ", ".join(f"{c} {draft_step_ms(d, batch, args.prompt_len):.2f}" for c, d in drafts.items())
        print(f"draft step ms at batch {batch}: {times}", flush=True)
    for batch in args.verify_times:
        times = ", ".join(f"{w} {verify_ms(target, batch, w, args.prompt_len):.2f}" for w in (1, 3, 5, 9))
        print(f"target pass ms at batch {batch} by window: {times}", flush=True)
    if args.check_draft_steps:
        check = check_draft_steps(drafts[first].loaded, args.check_draft_steps, args.prompt_len)
        print("draft step check: " + ", ".join(f"{name} {value:.4g}" for name, value in check.items()), flush=True)
    if args.sync_report:
        syncs = sync_report(target, drafts[first], args.prompt_len)
        print(f"host waits for the device over 8 tokens of 2 sessions at k = 4: {sum(syncs.values())}")
        for line, count in syncs.most_common():
            print(f"  {count:5d}  {line}")
    print(TABLE_HEADER, flush=True)
    rows = []
    for row in measure(target, drafts, points, args.prompt_len, args.max_tokens):
        rows.append(row)
        print(format_row(row), flush=True)
        if args.json is not None:  # after every row: a run cut short keeps what it measured
            args.json.write_text(json.dumps({"target": args.target, "draft": args.draft, "dtype": args.dtype,
                                             "device": str(device), "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
