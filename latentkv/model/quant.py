"""Weight-only quantized linears for memory-bound decode; activations stay in the model dtype.

- int8: per-output-channel scales (`scale = max|w| / 127`); half the bytes of bf16.
- int4: groups of 32 along the input, asymmetric (`w = (q - 8) * scale + zero`, q in 0..15),
  the layout of ATen's CPU int4 kernel (the one gpt-fast and torchao use); a quarter of
  the bytes of bf16. Q4_1 GGUF weights (block 32, scale + min) fit it exactly, up to the
  bf16 rounding of scale and zero.
On the CPU both run latentkv's kernel (kernels/qlinear.py: any K and N, batch-invariant), else
ATen's (`_weight_int4pack_mm_for_cpu`: K a multiple of 32; `_weight_int8pack_mm`: K of 16).

- w4a8 / w8a8: the same int4 / int8 weights times activations quantized to int8 on the fly (per row
  and group of 32, scale max|x| / 127), integer dot products (qlinear.dot_linear: CPU only,
  batch-invariant). Where latentkv's kernel is not built they fall back to int4 / int8 (float
  activations) with one warning.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import qlinear

SKIP = ("kv_b_proj",)  # the absorbed path reads W_UK / W_UV directly; keep them exact
INT4_GROUP = 32
QUANTIZATIONS = ("int8", "int4", "w4a8", "w8a8")
INT_DOT = {"w4a8": "int4", "w8a8": "int8"}  # integer-dot kinds (CPU, the native kernel) -> the weight-only kind without it


class QuantLinear(nn.Module):
    """A linear whose weight is stored quantized; subclasses give `matmul(x [M, K]) -> [M, N]`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x.reshape(-1, self.in_features))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def native(linear: nn.Linear) -> bool:
    """Whether latentkv's kernel (kernels/qlinear.py) runs this linear: a CPU weight, the extension built."""
    return linear.weight.device.type == "cpu" and qlinear.available()


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (codes [N, K] int8 in -127..127, scale [N] float32); w ~ codes * scale."""
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1).clamp_min(1e-12) / 127
    return (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


class Int8Linear(QuantLinear):
    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        codes, scale = quantize_int8(linear.weight)
        self.register_buffer("scales", scale.to(linear.weight.dtype))
        self.native = native(linear)
        if self.native:
            self.register_buffer("weight_packed", qlinear.pack_int8(codes, self.scales))
        else:
            self.register_buffer("weight_int8", codes)

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        if self.native:
            return qlinear.linear(flat, self.weight_packed, 8, self.out_features)
        if flat.device.type == "cpu" and self.in_features % 16 == 0:
            # ATen's AVX-512/AVX2 int8 kernel (it returns garbage when K is not a multiple of 16)
            return torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales.to(flat.dtype))
        return F.linear(flat, self.weight_int8.to(flat.dtype)) * self.scales.to(flat.dtype)


def quantize_int4(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (codes [N, K] int32 in 0..15, scale_zero [K/group, N, 2] float32)."""
    n, k = w.shape
    wf = w.detach().float().view(n, k // group, group)
    lo, hi = wf.amin(-1), wf.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    codes = ((wf - lo[..., None]) / scale[..., None]).round().clamp(0, 15).view(n, k).to(torch.int32)
    return codes, torch.stack((scale, lo + 8 * scale), dim=-1).transpose(0, 1).contiguous()


def dequantize_int4(codes: torch.Tensor, scale_zero: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """Inverse of quantize_int4 -> w [N, K] float32 (the reference the kernel must match)."""
    n, k = codes.shape
    scale, zero = scale_zero.float().transpose(0, 1).unbind(-1)  # [N, K/group] each
    return ((codes.float().view(n, k // group, group) - 8) * scale[..., None] + zero[..., None]).view(n, k)


def int4_supported(linear: nn.Linear) -> bool:
    """latentkv's kernel takes any CPU linear; ATen's needs whole groups along K (N: Int4Linear pads it)."""
    return linear.weight.device.type == "cpu" and (native(linear) or linear.in_features % INT4_GROUP == 0)


class Int4Linear(QuantLinear):
    """latentkv's kernel: K padded with zero weights to whole groups (the padded inputs count as 0),
    rows packed in blocks (kernels/qlinear.py). ATen's: output rows padded with zero weights to a
    multiple of 16 (its N block) and cut off after the matmul (a view): MLA's packed q / kv_a
    projection (9 x 146 + 320 = 1634 rows for the bundled model) otherwise stayed unquantized."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        w = linear.weight.detach()
        self.native = native(linear)
        if self.native:
            codes, scale_zero = quantize_int4(F.pad(w, (0, -self.in_features % INT4_GROUP)))
            self.register_buffer("weight_packed", qlinear.pack_int4(codes, scale_zero.to(w.dtype)))
            return
        codes, scale_zero = quantize_int4(F.pad(w, (0, 0, 0, -self.out_features % 16)))
        self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("scale_zero", scale_zero.to(w.dtype))

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        if self.native:
            return qlinear.linear(flat, self.weight_packed, 4, self.out_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight_int4, INT4_GROUP, self.scale_zero.to(flat.dtype))
        return y[:, :self.out_features]


class W4A8Linear(QuantLinear):
    """Int4Linear's weights (quantize_int4, K padded to whole groups) in the integer-dot layout
    (qlinear.pack_w4a8); activations quantized to int8 per row and group of 32 inside the kernel."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        w = linear.weight.detach()
        codes, scale_zero = quantize_int4(F.pad(w, (0, -self.in_features % INT4_GROUP)))
        self.register_buffer("weight_packed", qlinear.pack_w4a8(codes, scale_zero.to(w.dtype)))

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return qlinear.dot_linear(flat, self.weight_packed, 4, self.out_features)


class W8A8Linear(QuantLinear):
    """Int8Linear's weights (quantize_int8, a scale per row) times int8 activations (qlinear.pack_w8a8)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        codes, scale = quantize_int8(linear.weight)
        self.register_buffer("weight_packed", qlinear.pack_w8a8(codes, scale.to(linear.weight.dtype)))

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return qlinear.dot_linear(flat, self.weight_packed, 8, self.out_features)


class FixedOrderLinear(QuantLinear):
    """A float32 or bf16 linear through latentkv's kernel (kernels/qlinear.py, the float32 / bf16
    record, kept in the weight's dtype): each output element reduces over K in one fixed order
    (float32 accumulation) whatever M, so a row's bits do not depend on the batch. Batch-invariant
    mode puts it in place of the model's CPU linears (use_fixed_order_linears): MKL's
    small-M sgemm rounds by M and runs ~4x slower than its GEMV on an AVX2 EPYC, and oneDNN picks
    its bf16 kernels by M and CPU (on an AMX Xeon the lm_head's row 0 changed bits from M = 33)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.bits = 16 if linear.weight.dtype == torch.bfloat16 else 32
        pack = qlinear.pack_bf16 if self.bits == 16 else qlinear.pack_f32
        self.register_buffer("weight_packed", pack(linear.weight))

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return qlinear.linear(flat, self.weight_packed, self.bits, self.out_features)


def quantize_linears(model: nn.Module, kind: str = "int8") -> int:
    """Replace nn.Linear layers (but kv_b_proj) in place; returns how many were replaced.
    int4 leaves the few linears its kernel cannot take (K % 32) in the model dtype; w4a8 / w8a8
    need latentkv's kernel and a CPU model, and run int4 / int8 (one warning) where it is not built.
    kv_b_proj stays a linear, its values rounded to bf16 (exact in either path: the naive path
    expands with them, the absorbed decode reads W_UK / W_UV stored in bf16, half the bytes of
    float32 — at short context those reads were ~12% of an int4 decode step)."""
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {kind!r}")
    linears = [(parent, name, child) for parent in list(model.modules()) for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and name not in SKIP]
    if kind in INT_DOT:
        if any(child.weight.device.type != "cpu" for _, _, child in linears):
            raise ValueError(f"quantization {kind!r} has CPU kernels only")
        if not qlinear.available():
            warnings.warn(f"latentkv: {kind} needs the native linears ({qlinear.unavailable_reason()}); "
                          f"using {INT_DOT[kind]} weights with float activations instead", RuntimeWarning, stacklevel=2)
            kind = INT_DOT[kind]
    for attn in model.modules():
        if hasattr(attn, "absorbed_dtype") and attn.kv_b_proj.weight.device.type == "cpu":
            with torch.no_grad():
                attn.kv_b_proj.weight.copy_(attn.kv_b_proj.weight.to(torch.bfloat16))
            attn.absorbed_dtype = torch.bfloat16
    cls = {"int8": Int8Linear, "int4": Int4Linear, "w4a8": W4A8Linear, "w8a8": W8A8Linear}[kind]
    count = 0
    for parent, name, child in linears:
        if kind == "int4" and not int4_supported(child):
            continue
        setattr(parent, name, cls(child))
        count += 1
    return count


def use_fixed_order_linears(model: nn.Module) -> int:
    """Put `FixedOrderLinear` (latentkv's fixed-order kernel) in place of the float32 and bf16 CPU
    linears of a model the caller owns for inference (the engine's own, as loaded), where the
    kernel is built; not `SKIP` (kv_b_proj: the absorbed path reads its weight). -> how many.
    The modules are replaced (no autograd, packed weights), so never on a model being trained."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.weight.dtype in (torch.float32, torch.bfloat16) \
                    and name not in SKIP and native(child):
                setattr(parent, name, FixedOrderLinear(child))
                count += 1
    return count


def linear_kind(linear: nn.Module) -> str:
    """How a linear computes (the start-up line names it): latentkv's packed kernel ("native"),
    ATen's int kernels, or torch's matmul (with the invariance padding where installed)."""
    if isinstance(linear, FixedOrderLinear):
        return f"{'bf16' if linear.bits == 16 else 'float32'} fixed-order (native)"
    if isinstance(linear, (W4A8Linear, W8A8Linear)):
        return f"{'w4a8' if isinstance(linear, W4A8Linear) else 'w8a8'} (native)"
    if isinstance(linear, (Int4Linear, Int8Linear)):
        return f"{'int4' if isinstance(linear, Int4Linear) else 'int8'} ({'native' if linear.native else 'ATen'})"
    padded = " padded" if getattr(linear, "_invariant_hooked", False) else ""
    return f"{str(linear.weight.dtype).removeprefix('torch.')} torch{padded}"
