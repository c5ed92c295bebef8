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
  activations) with one warning (model/route.py decides).
- w4a8_g128: w4a8 with weights and activations in groups of 128 (4.25 bits a weight): the integer
  sums run 128 deep before each float step, so at many rows it runs faster (V3-mini's shape: prefill
  ~1.4x w4a8's, a 32-sequence step ~9% shorter), but coarser groups cost accuracy; a model whose
  weights are already int4 on groups of 32 (a Q4_1 GGUF's, the bundled one) keeps them nearly exactly
  only at 32
  (docs/results/amx-xeon/w4a8-limits: top-1 agreement with float32 0.77 at 32, 0.55 at 128).
  Without the kernel it falls back to int4 (groups of 32) as w4a8 does.
- FixedOrderLinear: float32 / bf16 weights through the same kernel, for batch invariance.

The model is built with these classes (model/route.py `Route.linear`: the route says which); each
holds the checkpoint's float `weight` until the loader, having filled it, calls `pack_weights()`,
which turns it into the kernel's layout once. `from_linear` packs a copy of an nn.Linear.
Packing works on blocks of rows (every layout is row-local, padded at the end only), so its float
and integer temporaries stay a few MiB whatever the matrix (a 102400-row lm_head took ~3 GiB whole).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import qlinear

SKIP = ("kv_b_proj",)  # the absorbed path reads W_UK / W_UV directly; keep them exact
INT4_GROUP = 32
QUANTIZATIONS = ("int8", "int4", "w4a8", "w4a8_g128", "w8a8")
INT_DOT = {
    "w4a8": "int4",
    "w4a8_g128": "int4",
    "w8a8": "int8",
}  # integer-dot kinds (CPU, the native kernel) -> the weight-only kind without it
PACK_ELEMENTS = 1 << 22  # weights packed at a time (pack_weights): 16 MiB of float32 temporaries per step


class QuantLinear(nn.Module):
    """A linear whose weight is stored packed; subclasses give `pack(weight [n, K]) -> {buffer name:
    tensor}` (row-local: n rows' buffers, rows along dim 0 or as `ROW_DIMS` says) and
    `matmul(x [M, K]) -> [M, N]`. `parts` (a packed projection's checkpoint tensors, as
    PackedLinear's) lets the loader fill `weight` part by part. `uses_qlinear`: latentkv's kernel
    (kernels/qlinear.py) runs it, else ATen's int kernels (the route decides)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        parts: list[tuple[str, int, bool]] | None = None,
        uses_qlinear: bool = True,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.uses_qlinear = uses_qlinear
        if parts:
            self.parts, self.sizes = parts, [rows for _, rows, _ in parts]
        self.weight = nn.Parameter(torch.empty(out_features, in_features))  # the loaded weight, until packed
        self.register_parameter("bias", nn.Parameter(torch.empty(out_features)) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, uses_qlinear: bool = True) -> "QuantLinear":
        """A packed copy of `linear` (its bias shared)."""
        return cls.from_weight(linear.weight.detach(), linear.bias, uses_qlinear)

    @classmethod
    def from_weight(
        cls, weight: torch.Tensor, bias: nn.Parameter | None = None, uses_qlinear: bool = True
    ) -> "QuantLinear":
        """The packed linear x -> x · weightᵀ (+ bias) of weight [out, in]."""
        q = cls(weight.shape[1], weight.shape[0], uses_qlinear=uses_qlinear)
        q.weight.data = weight
        q.bias = bias
        q.pack_weights()
        return q

    ROW_DIMS: dict[str, int] = {}  # a buffer whose rows are not along dim 0 -> its row dim
    # a parent's callback(weight, bias) that reads the float weight before it goes; it may return
    # (weight, bias) to pack instead (MLAttention: its query rows folded, fewer of them)
    before_pack = None

    @torch.no_grad()
    def pack_weights(self) -> None:
        """The loaded `weight` -> the kernel's buffers, PACK_ELEMENTS weights (whole blocks of the
        kernels' row padding) at a time; the float weight goes (a tied lm_head's embedding stays
        with the embedding). Once: a later call does nothing (a module that reads its children's
        packed buffers, deepseek.MoE, packs them first, whatever order its caller visits)."""
        if self.packed:
            return
        weight = self.weight.detach()
        replaced = self.before_pack(weight, self.bias) if self.before_pack is not None else None
        if replaced is not None:
            weight, bias = replaced
            self.out_features = weight.shape[0]
            if bias is not None:
                self.bias = nn.Parameter(bias, requires_grad=False)
        del self.weight
        rows = max(qlinear.ROW_PAD, PACK_ELEMENTS // max(self.in_features, 1) // qlinear.ROW_PAD * qlinear.ROW_PAD)
        pieces = [self.pack(weight[start : start + rows]) for start in range(0, weight.shape[0], rows)]
        for name in list(pieces[0]):
            parts = [piece.pop(name) for piece in pieces]
            self.register_buffer(name, parts[0] if len(parts) == 1 else torch.cat(parts, self.ROW_DIMS.get(name, 0)))

    @property
    def packed(self) -> bool:
        """pack_weights ran: the float weight is gone."""
        return "weight" not in self._parameters

    @property
    def record(self) -> int | None:
        """The qlinear record kind this linear runs (the decode plan calls the kernel with it); None: not qlinear's."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x.reshape(-1, self.in_features))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (codes [N, K] int8 in -127..127, scale [N] float32); w ~ codes * scale."""
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1).clamp_min(1e-12) / 127
    return (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


class Int8Linear(QuantLinear):
    def pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale = quantize_int8(weight)
        scales = scale.to(weight.dtype)
        if self.uses_qlinear:
            return {"scales": scales, "weight_packed": qlinear.pack_int8(codes, scales)}
        return {"scales": scales, "weight_int8": codes}

    @property
    def record(self) -> int | None:
        return 8 if self.uses_qlinear else None

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        if self.uses_qlinear:
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


class Int4Linear(QuantLinear):
    """latentkv's kernel: K padded with zero weights to whole groups (the padded inputs count as 0),
    rows packed in blocks (kernels/qlinear.py). ATen's (K a multiple of 32: the route keeps other
    linears in the model dtype): output rows padded with zero weights to a multiple of 16 (its N
    block) and cut off after the matmul (a view): MLA's packed q / kv_a projection (9 x 146 + 320 =
    1634 rows for the bundled model) otherwise stayed unquantized."""

    ROW_DIMS = {"scale_zero": 1}  # [K/32, N, 2]

    def pack(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.uses_qlinear:
            codes, scale_zero = quantize_int4(F.pad(w, (0, -self.in_features % INT4_GROUP)))
            return {"weight_packed": qlinear.pack_int4(codes, scale_zero.to(w.dtype))}
        codes, scale_zero = quantize_int4(F.pad(w, (0, 0, 0, -w.shape[0] % 16)))  # only the last block is short
        return {
            "weight_int4": torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1),
            "scale_zero": scale_zero.to(w.dtype),
        }

    @property
    def record(self) -> int | None:
        return 4 if self.uses_qlinear else None

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        if self.uses_qlinear:
            return qlinear.linear(flat, self.weight_packed, 4, self.out_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.weight_int4, INT4_GROUP, self.scale_zero.to(flat.dtype)
        )
        return y[:, : self.out_features]


class W4A8Linear(QuantLinear):
    """Int4Linear's codes (quantize_int4 on groups of `group`, K padded to whole groups) in the integer-dot
    layout (qlinear.pack_w4a8), each group's scale and lowest weight stored as float16 (5 bits a weight
    on groups of 32, as Q4_1); activations quantized to int8 per row and group inside the kernel."""

    record = qlinear.ACT8 + 4
    group = INT4_GROUP

    def pack(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale_zero = quantize_int4(F.pad(w, (0, -self.in_features % self.group)), self.group)
        return {"weight_packed": qlinear.pack_w4a8(codes, scale_zero.to(w.dtype))}

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return qlinear.dot_linear(flat, self.weight_packed, self.record, self.out_features)


class W4A8G128Linear(W4A8Linear):
    """W4A8Linear on groups of 128 inputs (4.25 bits a weight; activations per 128 too)."""

    record = qlinear.W4A8_G128
    group = qlinear.G128


class W8A8Linear(QuantLinear):
    """Int8Linear's weights (quantize_int8, a scale per row) times int8 activations (qlinear.pack_w8a8)."""

    record = qlinear.ACT8 + 8

    def pack(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale = quantize_int8(w)
        return {"weight_packed": qlinear.pack_w8a8(codes, scale.to(w.dtype))}

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return qlinear.dot_linear(flat, self.weight_packed, self.record, self.out_features)


class FixedOrderLinear(QuantLinear):
    """A float32 or bf16 linear through latentkv's kernel (kernels/qlinear.py, the float32 / bf16
    record, kept in the weight's dtype): each output element reduces over K in one fixed order
    (float32 accumulation) whatever M, so a row's bits do not depend on the batch. Batch-invariant
    mode builds the model's CPU linears with it (model/route.py): MKL's small-M sgemm rounds by M
    and runs ~4x slower than its GEMV on an AVX2 EPYC, and oneDNN picks its bf16 kernels by M and
    CPU (on an AMX Xeon the lm_head's row 0 changed bits from M = 33)."""

    def pack(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        self.bits = 16 if w.dtype == torch.bfloat16 else 32
        return {"weight_packed": (qlinear.pack_bf16 if self.bits == 16 else qlinear.pack_f32)(w)}

    @property
    def record(self) -> int | None:
        return self.bits

    def matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return qlinear.linear(flat, self.weight_packed, self.bits, self.out_features)

    def swiglu_runs(self, dtype: torch.dtype) -> bool:
        """Whether `swiglu` takes rows of `dtype` here (the decode plan asks the same)."""
        return (
            self.packed
            and self.bias is None
            and dtype == torch.bfloat16
            and self.out_features % 2 == 0
            and qlinear.fused_swiglu(self.bits, self.out_features // 2)
        )

    def swiglu(self, x: torch.Tensor) -> torch.Tensor | None:
        """This [gate; up] linear's x [..., K] -> silu(gate) * up [..., I] in one native call where it
        runs (bf16 rows on AMX: qlinear.fused_swiglu), the bits of forward then decode_ops' silu_mul;
        None elsewhere."""
        if not self.swiglu_runs(x.dtype):
            return None
        inter = self.out_features // 2
        return qlinear.swiglu_linear(x.reshape(-1, self.in_features), self.weight_packed, inter).view(
            *x.shape[:-1], inter
        )


# how the route names each class (model/route.py WEIGHTS)
LINEAR_CLASSES = {
    "fixed-order": FixedOrderLinear,
    "int8": Int8Linear,
    "int4": Int4Linear,
    "w4a8": W4A8Linear,
    "w4a8_g128": W4A8G128Linear,
    "w8a8": W8A8Linear,
}


def linear_kind(linear: nn.Module) -> str:
    """How a linear computes (the start-up line names it): latentkv's packed kernel ("native"),
    ATen's int kernels, or torch's matmul (with the invariance padding where installed)."""
    if isinstance(linear, FixedOrderLinear):
        return f"{'bf16' if linear.bits == 16 else 'float32'} fixed-order (native)"
    if isinstance(linear, (W4A8Linear, W8A8Linear)):
        names = {W4A8Linear: "w4a8", W4A8G128Linear: "w4a8_g128", W8A8Linear: "w8a8"}
        return f"{names[type(linear)]} (native)"
    if isinstance(linear, (Int4Linear, Int8Linear)):
        return f"{'int4' if isinstance(linear, Int4Linear) else 'int8'} ({'native' if linear.uses_qlinear else 'ATen'})"
    padded = " padded" if getattr(linear, "_invariant_hooked", False) else ""
    return f"{str(linear.weight.dtype).removeprefix('torch.')} torch{padded}"
