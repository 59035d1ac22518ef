"""Linear weights prepacked once, at load, in oneDNN's blocked layout, for CPU inference.

bfloat16: a plain `nn.Linear` on the CPU hands oneDNN a row-major weight, which it reorders on every call;
a decode step reads each weight about twice. Packing once removes that, with the same kernel: the outputs
are bit-identical.

float32: a plain `nn.Linear` calls MKL's sgemm, which on CPUs without AVX-512 (measured on a 2-core AMD
EPYC, AVX2) takes 3x as long for a 5-row verification window as for one row; oneDNN's packed kernel,
laid out for 8 rows, takes 1.2-2x (laid out for one, five rows took 1.5x as long; one row no less).
Measured per layer, one row and five: 8960 x 1536, 3.1 -> 2.5 ms and 9.4 -> 3.4 ms; the 151936-row
output layer, 60 -> 46 ms and 210 -> 50 ms. The kernels sum in other orders, so outputs agree to
rounding, not bit for bit (neither kernel gives a row the same bits alone as among several: a decode
step and a window never agreed bitwise in float32).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

_CHECK_ROWS = (1, 5)  # a decode step and a verification window


class PackedLinear(nn.Module):
    """`nn.Linear` over a weight in oneDNN's layout (bfloat16: exactly what the plain layer computed)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # an attribute, not a parameter: an opaque oneDNN tensor that state_dict() and .to() must not see
        weight = linear.weight.detach()
        rows_hint = 8 if weight.dtype == torch.float32 else 1
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packing_supported(dtype: torch.dtype = torch.bfloat16) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def pack_linears(model: nn.Module) -> int:
    """Replace every bfloat16 or float32 `nn.Linear` on the CPU by a `PackedLinear` whose outputs match the
    plain layer's (checked per layer on random inputs: bfloat16 bit for bit, float32 to rounding; a layer
    that differs stays plain). Tied weights stay in place for the modules that share them (the embedding).
    Returns how many were packed."""
    num_packed = num_kept = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            plain = type(child) is nn.Linear and packing_supported(child.weight.dtype)
            if not plain or child.weight.device.type != "cpu":
                continue
            packed = PackedLinear(child)
            if _same_outputs(child, packed):
                setattr(parent, name, packed)
                num_packed += 1
            else:
                num_kept += 1
    if num_kept:
        logger.warning("kept %d Linear layers unpacked: oneDNN's packed layout computed different values", num_kept)
    logger.info("packed %d Linear layers for oneDNN", num_packed)
    return num_packed


@torch.inference_mode()
def _same_outputs(linear: nn.Linear, packed: PackedLinear) -> bool:
    generator = torch.Generator().manual_seed(0)
    dtype = linear.weight.dtype
    for rows in _CHECK_ROWS:
        x = torch.randn(rows, linear.in_features, generator=generator).to(dtype)
        expected, got = linear(x), packed(x)
        same = torch.equal(expected, got) if dtype == torch.bfloat16 else _within_rounding(expected, got)
        if not same:
            return False
    return True


def _within_rounding(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """float32 sums of `in_features` products in another order: off by a few units of the output's scale's
    last places, far below any difference between two logits that decides a token."""
    return bool(((expected - got).abs() <= 1e-5 * expected.abs().max()).all())
