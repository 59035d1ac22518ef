"""Quantized Linear layers for a draft on the CPU. A draft's proposals may be approximate without changing
the output (the target checks every one), so its weights can trade precision for a cheaper step.

- int8: per-channel dynamic int8 (fbgemm; float32 activations).
- int4: weight-only int4 in groups of 32 (torch's CPU kernel; bfloat16 activations) for passes over at
  most INT4_MAX_ROWS positions, the draft's decode steps; longer passes (prompt chunks, batches) run the
  same layer's int8 weights, since torch's int4 kernel slows down with rows (measured on the 0.5B draft,
  2 cores: one position 0.7-0.9x the int8 step, four 1.4x, a 256-token prompt chunk 2.5x).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

INT4_GROUP_SIZE = 32
INT4_MAX_ROWS = 2


def int4_supported() -> bool:
    """torch's int4 CPU kernel is there, and oneDNN takes bfloat16 on this CPU (any AVX-512: without it, on an
    AVX2 EPYC, int8 was faster; on an AVX-512 Xeon without BF16 instructions the 0.5B draft's int4 step
    still took 0.7x its int8 step, 44 against 62 ms on one thread)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def quantize_int8(model: nn.Module, device: torch.device) -> nn.Module:
    """Per-channel dynamic int8 quantization of every Linear layer (weights int8, activations float32)."""
    _require_cpu(device, "int8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch points eager quantization users to torchao
        return _int8_dynamic(model)


def quantize_int4(model: nn.Module, device: torch.device) -> int:
    """Replace every Linear layer by an `Int4Linear`; returns how many got int4 weights (the others, of a
    shape torch's int4 kernel does not take, run int8 only)."""
    _require_cpu(device, "int4")
    num_int4 = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                layer = Int4Linear(child)
                setattr(parent, name, layer)
                num_int4 += layer.packed_weight is not None
    return num_int4


class Int4Linear(nn.Module):
    """A Linear layer as int4 weights (groups of INT4_GROUP_SIZE along the input, a scale and an offset
    each) for passes over few positions, and as int8 weights for the others. Outputs in the input's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        float_linear = _float_copy(linear)
        weight = float_linear.weight.detach()  # one float32 copy for both weight sets
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch points eager quantization users to torchao
            self.int8 = _int8_dynamic(nn.Sequential(float_linear))[0]
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        # attributes, not parameters: packed layouts that state_dict() and .to() must not see
        self.packed_weight: torch.Tensor | None = None
        self.scales_and_zeros: torch.Tensor | None = None
        if self.out_features % 16 == 0 and self.in_features % INT4_GROUP_SIZE == 0:  # the kernel's shapes
            self.packed_weight, self.scales_and_zeros = _pack_int4(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        rows = x.numel() // self.in_features
        if self.packed_weight is None or rows > INT4_MAX_ROWS:
            return self.int8(x.float()).to(x.dtype)
        flat = x.reshape(rows, self.in_features).to(torch.bfloat16)
        int4_mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        out = int4_mm(flat, self.packed_weight, INT4_GROUP_SIZE, self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        int4 = self.packed_weight is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, int4={int4}"


def quantization_label(model: nn.Module) -> str | None:
    """How this module's Linear layers are quantized ("int4 + int8", "int8 (dynamic)"), or None."""
    if any(isinstance(m, Int4Linear) for m in model.modules()):
        return "int4 + int8 (dynamic) for longer passes"
    if any("quantized" in type(m).__module__ for m in model.modules()):
        return "int8 (dynamic)"
    return None


def _pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group: w ~ q * scale + minimum, q in 0..15. torch's kernel computes
    (q - 8) * scale + zero, so zero = minimum + 8 * scale; scales and zeros are [groups, out, 2]."""
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).view(out_features, in_features)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    zero = low + 8 * scale
    scales_and_zeros = torch.stack([scale.view(out_features, -1).t(), zero.view(out_features, -1).t()], dim=-1)
    return packed, scales_and_zeros.contiguous().to(torch.bfloat16)


def _float_copy(linear: nn.Linear) -> nn.Linear:
    # built on the meta device: a random initialisation of a 150k-row output layer would be thrown away
    copy = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    copy.weight = nn.Parameter(linear.weight.detach().float(), requires_grad=False)
    if linear.bias is not None:
        copy.bias = nn.Parameter(linear.bias.detach().float(), requires_grad=False)
    return copy


def _int8_dynamic(model: nn.Module) -> nn.Module:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def _require_cpu(device: torch.device, quantization: str) -> None:
    if device.type != "cpu":
        raise ValueError(f"quantization={quantization} runs on the CPU only; use dtype=bfloat16 on GPUs")
