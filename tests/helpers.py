"""Shared test helpers: total-variation bounds, deliberately biased samplers, the near-tie check.

Imports only torch and specserve.core at load time, so the pure-core unit tests can use it. Also a subprocess
that cannot import the model libraries, for the client's tests.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from specserve.core.types import SamplingParams, Verdict

if TYPE_CHECKING:
    from specserve.bench.lossless import Divergence
    from specserve.models.loading import LoadedModel

K = TypeVar("K")

# ---------------------------------------------------------------------------------------------------
# Total variation


def tv_distance(empirical: Mapping[K, float], reference: Mapping[K, float]) -> float:
    """0.5 * sum |empirical - reference| over the union of both supports."""
    keys = set(empirical) | set(reference)
    return 0.5 * sum(abs(empirical.get(x, 0.0) - reference.get(x, 0.0)) for x in keys)


@torch.inference_mode()
def exact_joint(
    target: LoadedModel, prompt: str, sampling: SamplingParams, num_tokens: int
) -> dict[tuple[int, ...], float]:
    """The target's exact distribution of its next `num_tokens` sampled tokens after `prompt`:
    p(t1 | prompt) p(t2 | prompt, t1) ... from full forward passes, over every sequence in the support."""
    from specserve.core.verify import logits_to_probs

    prompt_ids = target.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    joint: dict[tuple[int, ...], float] = {}

    def expand(generated: tuple[int, ...], probability: float) -> None:
        if len(generated) == num_tokens:
            joint[generated] = probability
            return
        logits = _last_logits(target, prompt_ids + list(generated))[:, : target.vocab_size]  # padding rows cut off
        probs = logits_to_probs(logits, sampling)[0]  # [vocab]
        for token_id in torch.nonzero(probs).flatten().tolist():
            expand(generated + (token_id,), probability * float(probs[token_id]))

    expand((), 1.0)
    assert abs(sum(joint.values()) - 1.0) < 1e-5
    return joint


def _last_logits(target: LoadedModel, token_ids: list[int]) -> torch.Tensor:
    """Logits [1, vocab] after `token_ids` from one full pass of the target's engine."""
    from specserve.models.llama_cpp import LlamaCppModel, LlamaCppSequence

    if isinstance(target.model, LlamaCppModel):
        sequence = LlamaCppSequence(target.model, token_ids)
        logits = sequence.feed(1)
        sequence.release()
        return logits
    return target.model(input_ids=torch.tensor([token_ids])).logits[0, -1:]


def normalize(counts: Mapping[K, float]) -> dict[K, float]:
    total = sum(counts.values())
    assert total > 0, "no samples"
    return {x: c / total for x, c in counts.items()}


def tv_bound(
    reference: Mapping[K, float] | Sequence[float] | torch.Tensor, num_samples: int, delta: float = 1e-6
) -> float:
    """An upper bound the TV of `num_samples` i.i.d. draws from `reference` exceeds with probability <= delta.

    E[TV] <= 0.5 * sum_i sqrt(p_i (1 - p_i) / n) (Jensen on each |p^_i - p_i|), and TV changes by at most
    1/n when one sample changes, so McDiarmid adds sqrt(ln(1/delta) / (2n)). Seeded tests are deterministic
    anyway; the bound says how far from the target an honest sampler can plausibly land.
    """
    if isinstance(reference, Mapping):
        probs = [float(v) for v in reference.values()]
    elif isinstance(reference, torch.Tensor):
        probs = reference.double().flatten().tolist()
    else:
        probs = [float(v) for v in reference]
    assert num_samples > 0
    mean_bound = 0.5 * sum(math.sqrt(p * (1 - p) / num_samples) for p in probs if p > 0)
    return mean_bound + math.sqrt(math.log(1 / delta) / (2 * num_samples))


# ---------------------------------------------------------------------------------------------------
# Deliberately biased replacements for rejection_sample: the statistical tests must reject them


def always_accept(
    draft_token_ids: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Biased: emits the draft's distribution."""
    k = len(draft_token_ids)
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return Verdict(list(draft_token_ids) + [bonus], k)


def resample_target_on_rejection(
    draft_token_ids: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Biased: the right acceptance test, but a rejection resamples p instead of norm(max(0, p - q))."""
    k = len(draft_token_ids)
    for i, token_id in enumerate(draft_token_ids):
        ratio = float(target_probs[i, token_id] / draft_probs[i, token_id])
        if float(torch.rand(1, generator=generator)) >= ratio:
            recovered = int(torch.multinomial(target_probs[i], 1, generator=generator))
            return Verdict(list(draft_token_ids[:i]) + [recovered], i)
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return Verdict(list(draft_token_ids) + [bonus], k)


# ---------------------------------------------------------------------------------------------------
# Near ties: where speculative and target-only output may legitimately differ (bf16, batched, GPU)


def assert_divergence_is_near_tie(
    target: LoadedModel,
    prompt_token_ids: Sequence[int],
    reference_ids: Sequence[int],
    candidate_ids: Sequence[int],
    tolerance: float | None = None,
) -> Divergence | None:
    """None when the outputs are identical; else assert the first divergence is a near-tie of the target.

    Both tokens chosen at the first differing position must have logits within `tolerance` of the
    target's maximum there (recomputed one token per pass, as target-only decoding does). Later
    positions are not compared: after a divergence the contexts differ.
    """
    from specserve.bench.lossless import first_divergence

    divergence = first_divergence(target, prompt_token_ids, reference_ids, candidate_ids, tolerance)
    if divergence is None:
        return None
    assert None not in (divergence.reference_token_id, divergence.candidate_token_id), (
        f"one output is a strict prefix of the other (lengths {len(reference_ids)} and {len(candidate_ids)}) "
        "with no differing token: that is a stopping bug, not a near-tie"
    )
    assert divergence.near_tie, (
        f"real disagreement at generated position {divergence.position}: reference token "
        f"{divergence.reference_token_id} (gap to the max logit {divergence.reference_gap:.4g}) vs candidate "
        f"token {divergence.candidate_token_id} (gap {divergence.candidate_gap:.4g}); top-2 margin "
        f"{divergence.top2_margin:.4g}, tolerance {divergence.tolerance} for {target.dtype}"
    )
    return divergence


# ---------------------------------------------------------------------------------------------------
# A Python process that cannot import the model libraries

MODEL_LIBRARIES = ("torch", "transformers", "numpy", "ray", "specserve.models")

_REFUSE_MODEL_LIBRARIES = """
import importlib.abc, sys

class RefuseModelLibraries(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == refused or name.startswith(refused + ".") for refused in {refused!r}):
            raise ImportError(f"refused in this process: {{name}}")
        return None

sys.meta_path.insert(0, RefuseModelLibraries())
"""


def run_without_model_libraries(code: str, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run `code` (sys.argv[1:] = args) in a fresh interpreter at the repository root where importing any of
    MODEL_LIBRARIES raises ImportError."""
    root = Path(__file__).resolve().parents[1]
    program = _REFUSE_MODEL_LIBRARIES.format(refused=MODEL_LIBRARIES) + code
    return subprocess.run(
        [sys.executable, "-c", program, *args], cwd=root, capture_output=True, text=True, timeout=timeout_s
    )
