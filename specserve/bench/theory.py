"""The expected speedup of speculative decoding (Leviathan et al. 2023, with a measured verify cost)."""

from __future__ import annotations


def expected_speedup(alpha: float, k: float, c: float, v_k: float) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha) (k c + v_k)).

    alpha: per-token acceptance rate; c: draft step / target step; v_k: target pass over k + 1 tokens /
    target pass over 1 token. The numerator is the expected tokens per round (accepted + 1).
    """
    if k == 0:
        return 1.0 / v_k
    tokens_per_round = float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens_per_round / (k * c + v_k)
