"""Run every mode on every prompt, interleaved per prompt, and aggregate per mode."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from inprocess.engine import SpeculativeEngine
from specserve.bench.config import PIPELINED, SERVED_MODE_SUFFIXES, BenchConfig, Prompt, Runner, RunOutput
from specserve.bench.llama_cpp_peer import llama_cpp_modes
from specserve.bench.lossless import ReferenceDecoder, first_difference, first_divergence
from specserve.bench.overhead import overhead_figures
from specserve.bench.peer import hf_generate
from specserve.bench.served import ServedStack, client_runner, draft_variant
from specserve.bench.theory import expected_speedup
from specserve.bench.workloads import workload
from specserve.config import GenerationRequest
from specserve.core.stats import SpeculationStats
from specserve.models.attention import ATTENTION
from specserve.models.loading import DTYPES, LoadedModel, ModelConfig, load_model
from specserve.models.packing import PackedLinear
from specserve.models.quantized import quantization_label

logger = logging.getLogger(__name__)

ADAPTIVE = "served adaptive"
"""The served mode whose requests leave k to the server (its default: adaptive k)."""


@dataclass(slots=True)
class ModeResult:
    name: str
    kind: str  # "target-only" | "speculative" | "peer" | "served"
    k: int
    settings: str
    num_tokens: int = 0
    seconds: float = 0.0
    stats: SpeculationStats = field(default_factory=SpeculationStats)  # summed over prompts (ours only)
    draft: str = ""  # a served mode over an extra draft service (BenchConfig.extra_drafts): its name
    num_target_passes: int = 0  # peer only
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0

    def add_stats(self, stats: SpeculationStats) -> None:
        total = self.stats
        total.num_proposed += stats.num_proposed
        total.num_accepted += stats.num_accepted
        total.num_rounds += stats.num_rounds
        total.num_rejections += stats.num_rejections
        total.draft_s += stats.draft_s
        total.target_s += stats.target_s
        total.prefill_s += stats.prefill_s
        total.transport_s += stats.transport_s
        total.time_to_first_token_s += stats.time_to_first_token_s
        total.draft_pass_s += stats.draft_pass_s
        total.target_pass_s += stats.target_pass_s
        for source, proposed in stats.proposed_by_source.items():
            total.proposed_by_source[source] = total.proposed_by_source.get(source, 0) + proposed
            accepted = stats.accepted_by_source.get(source, 0)
            total.accepted_by_source[source] = total.accepted_by_source.get(source, 0) + accepted


def _ours(engine: SpeculativeEngine, k: int, cfg: BenchConfig) -> Runner:
    def run(prompt: Prompt) -> RunOutput:
        request = GenerationRequest(
            prompt_token_ids=tuple(prompt.token_ids), max_tokens=cfg.max_tokens, num_speculative_tokens=k,
            ignore_eos=cfg.ignore_eos,
        )  # fmt: skip
        result = engine.generate(request)
        return result.token_ids, result.stats.total_s, result.stats, 0

    return run


def _peer(target: LoadedModel, draft: LoadedModel | None, k: int | None, cfg: BenchConfig) -> Runner:
    def run(prompt: Prompt) -> RunOutput:
        out = hf_generate(target, draft, prompt.token_ids, cfg.max_tokens, k, cfg.ignore_eos)
        return out.token_ids, out.seconds, None, out.num_target_passes

    return run


def run_bench(cfg: BenchConfig, home: Path | None = None) -> dict:
    torch.manual_seed(0)
    target_config = ModelConfig(cfg.target, dtype=cfg.target_dtype)
    draft_config = ModelConfig(cfg.draft, quantization=cfg.draft_quantization)
    with ExitStack() as stack:
        if cfg.served:  # first: a worker's load briefly needs about twice its weights' memory
            extra = [ModelConfig(name, quantization=cfg.draft_quantization) for name in cfg.extra_drafts]
            served = stack.enter_context(ServedStack(target_config, draft_config, extra_drafts=extra))
        # without in-process modes the served stack holds specserve's target; the peer gets the one transformers ships
        # in process, or with no HF peer: ours (output checks on the served engine); else as transformers ships it
        target = load_model(target_config if cfg.in_process or not cfg.hf else _as_shipped(cfg), home)
        draft = load_model(draft_config, home)
        texts = workload_texts(cfg, target)
        prompts = [Prompt(t, target.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        if cfg.in_process:
            modes = _modes(cfg, target, draft, home)
        else:
            modes = _peer_modes(cfg, [(target, " plain")], draft) if cfg.hf else []
            if cfg.served and target.engine == "torch":
                modes += _other_dtype_baselines(cfg, target.dtype, home)  # the as-shipped target's: the served one's
        if cfg.served:
            from orchestrator.service import OrchestratorConfig

            settings = f"target {_dtype(target)}, draft {_dtype(draft)}, over gRPC"
            modes.append((ModeResult("served target-only", "served", 0, settings), served.runner(0, PIPELINED, cfg)))
            max_k = OrchestratorConfig().max_adaptive_k
            adaptive = ModeResult(ADAPTIVE, "served", max_k, f"{settings}, the server's default: adaptive k <= {max_k}")
            modes.append((adaptive, served.runner(None, PIPELINED, cfg)))
            for k in cfg.ks:
                for variant, suffix in SERVED_MODE_SUFFIXES.items():
                    if cfg.served_variants is not None and variant not in cfg.served_variants:
                        continue
                    name = f"served k={k}{suffix}"
                    modes.append((ModeResult(name, "served", k, settings), served.runner(k, variant, cfg)))
            modes += _extra_draft_modes(cfg, target, served, max_k)
        if cfg.address is not None:
            from specserve_client import SpecServeClient

            client = stack.enter_context(SpecServeClient(cfg.address))
            remote = f"the orchestrator at {cfg.address}"
            modes.append((ModeResult("remote target-only", "served", 0, remote), client_runner(client, 0, cfg)))
            for k in cfg.ks:
                modes.append((ModeResult(f"remote k={k}", "served", k, remote), client_runner(client, k, cfg)))
        if cfg.peer_llama_cpp is not None:
            peers = llama_cpp_modes(stack, cfg, home)
            modes += [(ModeResult(name, kind, 0, settings), run) for name, kind, settings, run in peers]
        for _, runner in modes:  # warm-up: first calls pay one-off allocation and kernel selection
            runner(Prompt(prompts[0].text[:48], prompts[0].token_ids[:16]))
        _measure(prompts, modes)
    return summarize(cfg, target, [p.token_ids for p in prompts], [m for m, _ in modes])


def workload_texts(cfg: BenchConfig, target: LoadedModel) -> list[str]:
    """The prompts of cfg.categories as raw text; chat-style ones rendered by the target's chat template,
    so that every mode (in process: token ids; served: the text) gets the same tokens."""
    texts = []
    for category in cfg.categories:
        for prompt, chat in workload(category, cfg.num_prompts):
            if chat:
                messages = [{"role": "user", "content": prompt}]
                prompt = str(target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            texts.append(prompt)
    return texts


def _extra_draft_modes(
    cfg: BenchConfig, target: LoadedModel, served: ServedStack, max_k: int
) -> list[tuple[ModeResult, Runner]]:
    """The served modes over each extra draft service: adaptive k, then each k; the same target worker."""
    modes: list[tuple[ModeResult, Runner]] = []
    for name in cfg.extra_drafts:
        settings = f"target {_dtype(target)}, draft {name}, over gRPC"
        variant = draft_variant(name)
        adaptive = ModeResult(
            f"served {name} adaptive", "served", max_k, f"{settings}, adaptive k <= {max_k}", draft=name
        )
        modes.append((adaptive, served.runner(None, variant, cfg)))
        for k in cfg.ks:
            mode = ModeResult(f"served {name} k={k}", "served", k, settings, draft=name)
            modes.append((mode, served.runner(k, variant, cfg)))
    return modes


def _modes(
    cfg: BenchConfig, target: LoadedModel, draft: LoadedModel, home: Path | None
) -> list[tuple[ModeResult, Runner]]:
    modes: list[tuple[ModeResult, Runner]] = []
    if target.engine != "torch":
        modes.append(_target_only(cfg, _dtype(target), target))
    for dtype in cfg.baseline_dtypes:
        resolved = ModelConfig(cfg.target, dtype=dtype).resolve_dtype(target.device)
        same = target.engine == "torch" and resolved == target.dtype
        modes.append(
            _target_only(cfg, dtype, target if same else load_model(ModelConfig(cfg.target, dtype=dtype), home))
        )
    settings = f"target {_dtype(target)}, draft {_dtype(draft)}"
    engine = SpeculativeEngine(target, draft)
    for k in cfg.ks:
        modes.append((ModeResult(f"specserve k={k}", "speculative", k, settings), _ours(engine, k, cfg)))
    if cfg.stop_threshold:
        stopping = SpeculativeEngine(target, draft, draft_confidence_threshold=cfg.stop_threshold)
        stop_settings = f"{settings}, windows end below confidence {cfg.stop_threshold}"
        for k in cfg.ks:
            mode = ModeResult(f"specserve k={k}+stop", "speculative", k, stop_settings)
            modes.append((mode, _ours(stopping, k, cfg)))
    # transformers' generate() needs transformers' models: torch-engine copies where ours run llama.cpp
    hf_target = target if target.engine == "torch" else load_model(_torch_engine(cfg.target, cfg.target_dtype), home)
    if cfg.hf:
        hf_draft = draft if draft.engine == "torch" else load_model(_torch_engine(cfg.draft, "auto", "auto"), home)
        targets = [(hf_target, "")]
        packed = any(isinstance(m, PackedLinear) for m in hf_target.model.modules())
        if cfg.hf_plain_target and (packed or hf_target.model.config._attn_implementation == ATTENTION):
            targets.append((load_model(_as_shipped(cfg), home), " plain"))
        modes += _peer_modes(cfg, targets, hf_draft)
    if cfg.hf_fp32_draft:
        fp32_draft = load_model(ModelConfig(cfg.draft, dtype="float32", quantization="none"), home)
        fp32 = f"target {_dtype(target)}, draft {_dtype(fp32_draft)}"
        for k in cfg.hf_ks if cfg.hf else ():
            peer = _peer(hf_target, fp32_draft, k, cfg)
            modes.append((ModeResult(f"hf assisted k={k} fp32 draft", "peer", k, fp32), peer))
        ours = _ours(SpeculativeEngine(target, fp32_draft), 4, cfg)
        modes.append((ModeResult("specserve k=4 fp32 draft", "speculative", 4, fp32), ours))
    return modes


def _target_only(cfg: BenchConfig, dtype: str, target: LoadedModel) -> tuple[ModeResult, Runner]:
    mode = ModeResult(f"target-only {dtype}", "target-only", 0, f"target {dtype}")
    return mode, _ours(SpeculativeEngine(target, None), 0, cfg)


def _other_dtype_baselines(
    cfg: BenchConfig, served_dtype: torch.dtype, home: Path | None
) -> list[tuple[ModeResult, Runner]]:
    """Without in-process modes: specserve's target-only, in process, in each baseline dtype the served target
    does not run in (where the CPU emulates bfloat16 the default is float32, and the fastest target-only
    setting might still be bfloat16's)."""
    other = [dtype for dtype in cfg.baseline_dtypes if DTYPES[dtype] != served_dtype]
    return [_target_only(cfg, dtype, load_model(ModelConfig(cfg.target, dtype=dtype), home)) for dtype in other]


def _torch_engine(name: str, dtype: str, quantization: str = "none") -> ModelConfig:
    return ModelConfig(name, dtype=dtype, quantization=quantization, engine="torch")


def _as_shipped(cfg: BenchConfig) -> ModelConfig:
    """The target as transformers ships it: no prepacked weights, no few-query attention."""
    return ModelConfig(
        cfg.target, dtype=cfg.target_dtype, pack_weights=False, few_query_attention=False, engine="torch"
    )


def _peer_modes(
    cfg: BenchConfig, targets: list[tuple[LoadedModel, str]], draft: LoadedModel
) -> list[tuple[ModeResult, Runner]]:
    """On each target (suffix " plain": as transformers ships it), HF's target-only and assisted generation at
    each constant k and at its defaults."""
    modes: list[tuple[ModeResult, Runner]] = []
    for model, suffix in targets:
        weights = f"target {_dtype(model)}" + (", plain weights, SDPA" if suffix else "")
        modes.append((ModeResult(f"hf target-only{suffix}", "target-only", 0, weights), _peer(model, None, None, cfg)))
        settings = f"{weights}, draft {_dtype(draft)}"
        for k in cfg.hf_ks:
            modes.append((ModeResult(f"hf assisted k={k}{suffix}", "peer", k, settings), _peer(model, draft, k, cfg)))
        defaults = ModeResult(f"hf assisted default{suffix}", "peer", 20, settings + ", HF defaults")
        modes.append((defaults, _peer(model, draft, None, cfg)))
    return modes


def _measure(prompts: list[Prompt], modes: list[tuple[ModeResult, Runner]]) -> None:
    """Every mode on every prompt, interleaved per prompt so drifts of a shared machine hit all alike."""
    with tqdm(total=len(prompts) * len(modes), desc="bench", unit="run") as bar:
        for prompt in prompts:
            for mode, runner in modes:
                token_ids, seconds, stats, passes = runner(prompt)
                mode.outputs.append(token_ids)
                mode.num_tokens += len(token_ids)
                mode.seconds += seconds
                mode.num_target_passes += passes
                if stats is not None:
                    mode.add_stats(stats)
                bar.set_postfix_str(f"{mode.name}: {len(token_ids) / seconds:.2f} tok/s")
                bar.update()


def _dtype(loaded: LoadedModel) -> str:
    if loaded.engine == "llama.cpp":
        return "llama.cpp GGUF"
    return quantization_label(loaded.model) or str(loaded.dtype).removeprefix("torch.")


def summarize(cfg: BenchConfig, target: LoadedModel, prompts: list[list[int]], modes: list[ModeResult]) -> dict:
    # HF's generate() and the served stack's k=0 too: the fastest target-only setting counts
    baselines = [m for m in modes if m.kind == "target-only" or (m.kind == "served" and m.k == 0)]
    fastest = max(baselines, key=lambda m: m.tokens_per_second)
    ours = [m for m in baselines if m.name.startswith("target-only")]
    # without in-process modes, the served (or remote) target-only is specserve's
    reference = next((m for m in ours if m.settings == f"target {_dtype(target)}"), None) or next(
        m for m in baselines if m.kind == "served"
    )
    target_step = reference.stats.target_s / max(1, reference.stats.num_rounds)  # one target pass over 1 token
    decoder = ReferenceDecoder(target)  # shared: modes departing on the same prompt share its decode
    rows = []
    for mode in modes:
        row: dict = {
            "mode": mode.name,
            "kind": mode.kind,
            "k": mode.k,
            "settings": mode.settings,
            "tokens": mode.num_tokens,
            "seconds": round(mode.seconds, 2),
            "tokens_per_second": round(mode.tokens_per_second, 3),
            **_decode_rate(mode),
            "speedup_vs_target": round(mode.tokens_per_second / fastest.tokens_per_second, 3),
        }
        if mode.kind in ("speculative", "served") and mode.k > 0 and mode.stats.num_proposed:
            s = mode.stats
            alpha = s.per_token_acceptance
            c = (s.draft_s / s.num_proposed) / target_step
            v_k = (s.target_s / s.num_rounds) / target_step
            # stops shorten a window, and adaptive k chooses each round's
            # (and a lookup's window is as long as the continuation it found)
            varies = mode.name.endswith(("+stop", "adaptive")) or "ngram" in mode.draft
            window = s.num_proposed / s.num_rounds if varies else mode.k
            theory = expected_speedup(alpha, window, c, v_k)
            speedup_same_target = mode.tokens_per_second / reference.tokens_per_second
            row.update(
                acceptance_rate=round(s.acceptance_rate, 4),
                per_token_acceptance=round(alpha, 4),
                length_bound=round(s.mean_acceptance_length / (window * c + v_k), 3),
                mean_accepted_per_round=round(s.mean_accepted_per_round, 3),
                mean_window=round(s.num_proposed / s.num_rounds, 3),
                mean_acceptance_length=round(s.mean_acceptance_length, 3),
                draft_step_ms=round(1000 * s.draft_s / s.num_proposed, 1),
                verify_ms=round(1000 * s.target_s / s.num_rounds, 1),
                c=round(c, 3),
                v_k=round(v_k, 3),
                theoretical_speedup=round(theory, 3),
                speedup_vs_same_target=round(speedup_same_target, 3),
                efficiency=round(speedup_same_target / theory, 3),
            )
        if mode.draft:  # which drafter made the drafts (the hybrid's mix)
            row.update(
                proposed_by_source=dict(mode.stats.proposed_by_source),
                accepted_by_source=dict(mode.stats.accepted_by_source),
            )
        if mode.kind == "served" and mode.stats.num_rounds:
            row["transport_ms_per_round"] = round(1000 * mode.stats.transport_s / mode.stats.num_rounds, 2)
            row.update(overhead_figures(mode.seconds, mode.stats))
            in_process = next((m for m in modes if m.kind == "speculative" and m.k == mode.k), None)
            if in_process is not None and mode.k and not mode.draft:
                row["served_vs_in_process"] = round(mode.tokens_per_second / in_process.tokens_per_second, 3)
        elif mode.kind == "peer" and mode.num_target_passes:
            # assisted generation verifies its first window in the prefill pass: every pass is a round
            row["mean_acceptance_length"] = round(mode.num_tokens / mode.num_target_passes, 3)
        if mode is not reference and mode.settings.startswith(f"target {_dtype(target)}"):
            row.update(_lossless(decoder, prompts, reference, mode))
        elif mode.kind == "target-only" or mode.name.startswith("llama.cpp"):
            # another engine or dtype: how long its greedy output agrees with ours
            row["agreement_with_target_only"] = _agreement(reference, mode)
        rows.append(row)
    return {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "baseline": fastest.name,
        "target_step_ms": round(1000 * target_step, 1),
        "modes": rows,
    }


def _decode_rate(mode: ModeResult) -> dict[str, float]:
    """Tokens per second after each request's first token, where the mode timed its first tokens."""
    decode_s = mode.seconds - mode.stats.time_to_first_token_s
    if not mode.stats.time_to_first_token_s or decode_s <= 0:
        return {}
    return {"decode_tokens_per_second": round((mode.num_tokens - len(mode.outputs)) / decode_s, 3)}


def _agreement(reference: ModeResult, mode: ModeResult) -> dict:
    lengths = [first_difference(ref, out) for ref, out in zip(reference.outputs, mode.outputs)]
    return {
        "identical": f"{lengths.count(None)}/{len(lengths)}",
        "tokens_until_first_difference": [len(ref) if n is None else n for n, ref in zip(lengths, reference.outputs)],
    }


def _lossless(decoder: ReferenceDecoder, prompts: list[list[int]], reference: ModeResult, mode: ModeResult) -> dict:
    identical, divergences = 0, []
    for prompt, ref, out in zip(prompts, reference.outputs, mode.outputs):
        if ref == out:
            identical += 1
            continue
        divergence = first_divergence(decoder, prompt, ref, out)
        divergences.append(divergence.to_dict() if divergence else None)
    return {"identical_to_target_only": f"{identical}/{len(prompts)}", "divergences": divergences}
