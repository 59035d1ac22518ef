"""bfloat16 Linear weights prepacked once, at load, in oneDNN's blocked layout, for CPU inference.

A plain bfloat16 `nn.Linear` on the CPU hands oneDNN a row-major weight, which it reorders on every
call; a decode step reads each weight about twice. Packing once removes that, with the same kernel.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

_CHECK_ROWS = (1, 5)  # a decode step and a verification window


class PackedLinear(nn.Module):
    """`nn.Linear` over a weight in oneDNN's layout; computes exactly what the plain layer did."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # an attribute, not a parameter: an opaque oneDNN tensor that state_dict() and .to() must not see
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packing_supported() -> bool:
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_linears(model: nn.Module) -> int:
    """Replace every bfloat16 `nn.Linear` on the CPU by a `PackedLinear` whose outputs are bit-identical
    to the plain layer's (checked per layer on random inputs; a layer that differs stays plain). Tied
    weights stay in place for the modules that share them (the embedding). Returns how many were packed."""
    if not packing_supported():
        return 0
    num_packed = num_kept = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            plain = type(child) is nn.Linear and child.weight.dtype == torch.bfloat16
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
    logger.info("packed %d bfloat16 Linear layers for oneDNN", num_packed)
    return num_packed


@torch.inference_mode()
def _same_outputs(linear: nn.Linear, packed: PackedLinear) -> bool:
    generator = torch.Generator().manual_seed(0)
    for rows in _CHECK_ROWS:
        x = torch.randn(rows, linear.in_features, generator=generator).to(torch.bfloat16)
        if not torch.equal(linear(x), packed(x)):
            return False
    return True
