"""greedy_verify, rejection_sample and logits_to_probs on handcrafted logits and probabilities."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import torch

from specserve.core.types import SamplingParams, Verdict
from specserve.core.verify import greedy_verify, logits_to_probs, rejection_sample
from tests.helpers import always_accept, normalize, resample_target_on_rejection, tv_bound, tv_distance

Sampler = Callable[[Sequence[int], torch.Tensor, torch.Tensor, torch.Generator], Verdict]


def distinct_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """[rows, vocab] with no ties, so argmax and top-k are unambiguous."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(vocab, generator=generator).float() for _ in range(rows)]) * 0.5


# ---------------------------------------------------------------------------------------------------
# greedy_verify


@pytest.mark.parametrize("k", [1, 2, 5])
def test_greedy_perfect_match(k: int) -> None:
    target_logits = distinct_logits(k + 1, 11)  # [k + 1, vocab]
    argmax = target_logits.argmax(-1).tolist()
    verdict = greedy_verify(argmax[:k], target_logits)
    assert verdict == Verdict(argmax[:k] + [argmax[k]], k), f"all {k} drafts match, expected them + the bonus"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_takes_the_first_of_tied_half_precision_logits(dtype: torch.dtype) -> None:
    # greedy_verify compares in float32 (faster on the CPU); the cast is exact, so a tie resolves as
    # torch's argmax over the model's own dtype does: the first maximal index
    target_logits = torch.randn(3, 151936, generator=torch.Generator().manual_seed(0)).to(dtype)
    top = target_logits.max()
    target_logits[:, [70000, 9, 150000]] = top + 1  # row maxima tied at three indices, not the first
    verdict = greedy_verify([9, 9], target_logits)
    assert target_logits.argmax(-1).tolist() == [9, 9, 9]
    assert verdict == Verdict([9, 9, 9], 2)


def test_greedy_early_mismatch() -> None:
    target_logits = distinct_logits(5, 11)  # [k + 1, vocab], k = 4
    argmax = target_logits.argmax(-1).tolist()
    wrong = (argmax[0] + 1) % 11
    verdict = greedy_verify([wrong] + argmax[1:4], target_logits)
    assert verdict == Verdict([argmax[0]], 0), "a first-position mismatch must emit only the target's token"


def test_greedy_mismatch_mid_round_ignores_later_matches() -> None:
    target_logits = distinct_logits(5, 11)  # [k + 1, vocab], k = 4
    argmax = target_logits.argmax(-1).tolist()
    drafts = argmax[:4]
    drafts[2] = (argmax[2] + 3) % 11  # drafts 3 still equals the argmax of row 3, but comes after a rejection
    verdict = greedy_verify(drafts, target_logits)
    assert verdict == Verdict(argmax[:2] + [argmax[2]], 2), verdict


def test_greedy_empty_draft() -> None:
    target_logits = distinct_logits(1, 11)  # [1, vocab]
    verdict = greedy_verify([], target_logits)
    assert verdict == Verdict([int(target_logits[0].argmax())], 0), "k = 0 must emit exactly the target's token"


def test_greedy_shape_mismatch_is_an_assertion() -> None:
    with pytest.raises(AssertionError):
        greedy_verify([1, 2, 3], distinct_logits(3, 11))  # needs k + 1 = 4 rows


# ---------------------------------------------------------------------------------------------------
# rejection_sample: deterministic properties

VOCAB = 6
K = 2


def random_probs(rows: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=generator) * 1.5).softmax(-1)


def test_rejection_sample_accepts_everything_when_draft_equals_target() -> None:
    target_probs = random_probs(K + 1, seed=1)  # [k + 1, vocab]
    draft_probs = target_probs[:K].clone()  # [k, vocab]
    generator = torch.Generator().manual_seed(0)
    for _ in range(500):
        drafts = torch.multinomial(draft_probs, 1, generator=generator).squeeze(1).tolist()
        verdict = rejection_sample(drafts, draft_probs, target_probs, generator)
        assert verdict.num_accepted == K and verdict.token_ids[:K] == drafts, verdict
        assert len(verdict.token_ids) == K + 1


def test_rejection_sample_never_emits_a_token_the_target_excludes() -> None:
    target_probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])  # [k + 1, vocab], k = 1
    draft_probs = torch.tensor([[0.7, 0.1, 0.1, 0.1]])  # [k, vocab]
    generator = torch.Generator().manual_seed(0)
    first_tokens = Counter()
    for _ in range(500):
        verdict = rejection_sample([0], draft_probs, target_probs, generator)
        assert verdict.num_accepted == 0, "a draft with target probability 0 must be rejected"
        first_tokens[verdict.token_ids[0]] += 1
    assert set(first_tokens) <= {1, 2}, f"recovered tokens outside the target's support: {first_tokens}"


def test_rejection_sample_empty_draft_samples_the_target() -> None:
    target_probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]])  # [1, vocab]
    verdict = rejection_sample([], target_probs[:0], target_probs, torch.Generator().manual_seed(0))
    assert verdict == Verdict([2], 0)


def test_rejection_sample_shape_mismatch_is_an_assertion() -> None:
    with pytest.raises(AssertionError):
        rejection_sample([1, 2], random_probs(2, 0), random_probs(2, 1))  # target needs k + 1 = 3 rows


# ---------------------------------------------------------------------------------------------------
# rejection_sample: the output is distributed exactly as the target's
#
# The target rows here do not depend on the context, so "sampling from the target alone" means position j is
# an independent draw from p[j]. Two exact consequences, checked against the same TV bound:
#  1. Per position within one call: the token emitted at position i, over the calls that reached i (drafts
#     0..i-1 accepted), is distributed as p[i]. Drafts and uniforms of different positions are independent,
#     so conditioning on earlier acceptances changes nothing. i = k is the bonus token.
#  2. Over the whole process (a new round starting right after each verdict, with the rows of the absolute
#     positions it covers), the joint of the first two tokens is p[0] x p[1].
# The same harness must reject the deliberately biased samplers in tests.helpers.


NUM_SAMPLES = 20_000
TARGET_PROBS = random_probs(K + 2, seed=0)  # [k + 2, vocab]: rows for absolute positions 0..k+1
DRAFT_PROBS = random_probs(K + 1, seed=100)  # [k + 1, vocab]


def per_position_tv(sampler: Sampler, num_samples: int = NUM_SAMPLES) -> list[tuple[float, float, int]]:
    """For each position i <= k of one call: (TV to p[i], bound, number of calls that reached i)."""
    draft_probs, target_probs = DRAFT_PROBS[:K], TARGET_PROBS[: K + 1]
    generator = torch.Generator().manual_seed(1234)
    counts = [Counter() for _ in range(K + 1)]
    for _ in range(num_samples):
        drafts = torch.multinomial(draft_probs, 1, generator=generator).squeeze(1).tolist()
        verdict = sampler(drafts, draft_probs, target_probs, generator)
        for i, token_id in enumerate(verdict.token_ids):
            counts[i][token_id] += 1
    out = []
    for i, counter in enumerate(counts):
        n = sum(counter.values())
        reference = dict(enumerate(target_probs[i].tolist()))
        out.append((tv_distance(normalize(counter), reference), tv_bound(reference, n), n))
    return out


def two_position_joint_tv(sampler: Sampler, num_samples: int = NUM_SAMPLES) -> tuple[float, float]:
    """TV of the first two emitted tokens of the whole process to p[0] x p[1], and the bound."""
    generator = torch.Generator().manual_seed(4321)
    counts: Counter[tuple[int, int]] = Counter()
    for _ in range(num_samples):
        out: list[int] = []
        while len(out) < 2:
            start = len(out)
            draft_probs = DRAFT_PROBS[start : start + K]  # [k, vocab]
            target_probs = TARGET_PROBS[start : start + K + 1]  # [k + 1, vocab]
            drafts = torch.multinomial(draft_probs, 1, generator=generator).squeeze(1).tolist()
            out += sampler(drafts, draft_probs, target_probs, generator).token_ids
        counts[(out[0], out[1])] += 1
    p0, p1 = TARGET_PROBS[0].tolist(), TARGET_PROBS[1].tolist()
    reference = {(a, b): p0[a] * p1[b] for a in range(VOCAB) for b in range(VOCAB)}
    return tv_distance(normalize(counts), reference), tv_bound(reference, num_samples)


def test_rejection_sample_matches_the_target_at_every_position() -> None:
    for i, (tv, bound, n) in enumerate(per_position_tv(rejection_sample)):
        assert n > 2000, f"too few calls reached position {i} ({n}) for a meaningful check"
        assert tv < bound, f"position {i}: TV {tv:.4f} to the target row over {n} samples exceeds {bound:.4f}"


def test_rejection_sample_joint_of_two_positions_matches_the_target() -> None:
    tv, bound = two_position_joint_tv(rejection_sample)
    assert tv < bound, f"joint of the first two tokens: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.parametrize("biased", [always_accept, resample_target_on_rejection])
def test_the_statistical_check_rejects_a_biased_sampler(biased: Sampler) -> None:
    tv, bound, n = per_position_tv(biased)[0]
    assert tv > bound, f"{biased.__name__}: position-0 TV {tv:.4f} within {bound:.4f}; the check has no power"
    joint_tv, joint_bound = two_position_joint_tv(biased, num_samples=5000)
    assert joint_tv > joint_bound, f"{biased.__name__}: joint TV {joint_tv:.4f} within {joint_bound:.4f}"


# ---------------------------------------------------------------------------------------------------
# logits_to_probs


def test_top_k_keeps_exactly_k_tokens_renormalized() -> None:
    logits = distinct_logits(3, 10, seed=3)  # [3, vocab]
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=4))
    for row in range(3):
        kept = set(torch.nonzero(probs[row]).flatten().tolist())
        assert kept == set(logits[row].topk(4).indices.tolist()), f"row {row} kept {kept}"
        expected = logits[row][sorted(kept)].softmax(-1)
        assert torch.allclose(probs[row][sorted(kept)], expected, atol=1e-6), "kept tokens must be renormalized"


def test_top_k_at_or_above_vocab_keeps_everything() -> None:
    logits = distinct_logits(2, 10, seed=4)
    for top_k in (0, 10, 50):
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=top_k))
        assert torch.allclose(probs, logits.softmax(-1), atol=1e-6), f"top_k={top_k}"


@pytest.mark.parametrize(("top_p", "num_kept"), [(0.4, 1), (0.75, 2), (0.85, 3), (0.99, 4), (1.0, 4)])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p: float, num_kept: int) -> None:
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])
    order = torch.tensor([2, 0, 3, 1])  # shuffled, so the kept set must be mapped back to vocabulary order
    logits = base[order].log()[None]  # [1, vocab]; token j has probability base[order[j]]
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))[0]
    kept_mass = base[:num_kept]
    expected = torch.zeros(4)
    for j in range(4):
        if order[j] < num_kept:
            expected[j] = base[order[j]] / kept_mass.sum()
    assert torch.allclose(probs, expected, atol=1e-6), f"top_p={top_p}: {probs.tolist()} != {expected.tolist()}"


def test_top_p_matches_a_reference_on_random_rows() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(20, 30, generator=generator) * 2  # [n, vocab]
    for top_p in (0.1, 0.5, 0.9):
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
        for row in range(logits.shape[0]):
            sorted_probs, order = logits[row].softmax(-1).sort(descending=True)
            num_kept = int((sorted_probs.cumsum(-1) < top_p).sum()) + 1  # smallest prefix with mass >= top_p
            assert set(torch.nonzero(probs[row]).flatten().tolist()) == set(order[:num_kept].tolist()), (
                f"row {row}, top_p={top_p}"
            )


@pytest.mark.parametrize("temperature", [0.25, 1.0, 2.0])
def test_temperature_scales_the_logits(temperature: float) -> None:
    logits = distinct_logits(3, 10, seed=6)
    probs = logits_to_probs(logits, SamplingParams(temperature=temperature))
    assert torch.allclose(probs, (logits / temperature).softmax(-1), atol=1e-6)


def test_temperature_applies_before_top_p() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()  # [1, vocab]
    # At T=2 the distribution flattens to ~[0.38, 0.29, 0.21, 0.12]: top_p=0.75 then needs three tokens, not two.
    probs = logits_to_probs(logits, SamplingParams(temperature=2.0, top_p=0.75))[0]
    assert torch.nonzero(probs).flatten().tolist() == [0, 1, 2], probs.tolist()


def test_rows_sum_to_one() -> None:
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(7)) * 3  # [n, vocab]
    for sampling in (
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.9, top_k=10, top_p=0.5),
    ):
        probs = logits_to_probs(logits, sampling)
        assert probs.dtype == torch.float32
        assert torch.allclose(probs.sum(-1), torch.ones(8), atol=1e-5), f"{sampling}: {probs.sum(-1).tolist()}"
        assert (probs >= 0).all()
