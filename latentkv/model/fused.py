"""Fused decode-step ops: the small operations between a layer's weight matmuls as one native
call each (kernels/csrc/decode_ops/decode_ops.cpp), with the PyTorch reference of each op beside it.

At batch 1 and short context a decode step is mostly per-op overhead: dozens of small eager ops
per layer, and the absorbed query / value bmm's that oneDNN runs at ~2 GFLOP/s for one row
(measured 2026-12-01 on a 2-core AVX2 EPYC). The native ops:
- `head_matmul`: per head x·W (W_UKᵀ q_nope beside the rotated q_rope, times the softmax scale;
  W_UV o_lat), float32 accumulation in a fixed order per row: batch-invariant by construction;
- `rope`: rotate q's rope part in one pass;
- `write_latent`: rope on k_r + quantization (int8 / fp8, scale per token) + the paged write (the cache's
  one writer: the reference is attention/paged.py write);
- `silu_mul`: SwiGLU's silu(gate) * up;
- `rms_norm`: RMSNorm, with the residual add before it (one pass instead of ~8 ops).
Whether the native ops run is the route's decision (model/route.py: CPU float32 / bfloat16, the
extension built; LATENTKV_FUSED=0 switches it off), handed to each op as `kernel`; each call then
runs the reference under autograd (healing trains through it). The native side (build, ISA,
self-check) is kernels/decode_ops.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.paged import write
from ..cache import coded
from ..cache.latent_cache import LatentCache
from ..kernels import decode_ops
from ..rope import apply_rope

EXT = decode_ops.EXT


def available() -> bool:
    return EXT.available()


def runs(kernel: bool) -> bool:
    """Whether this call runs the native op, where the route decided it does (`kernel`): not under
    autograd (the native ops have no backward)."""
    return kernel and not torch.is_grad_enabled()


def head_pack(w: torch.Tensor) -> torch.Tensor:
    """w [H, K, C] in the native head_matmul's AMX layout (packed once, passed with w), or an empty
    tensor where that path does not apply (no native ops, not AMX, not bf16, other shapes)."""
    if not EXT.available():
        return w.new_empty(0)
    return EXT.state["module"].head_pack(w.detach(), EXT.caps.mask)


def head_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: float = 1.0,
    extra: torch.Tensor | None = None,
    *,
    kernel: bool = False,
    packed: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [N, H, K] · w [H, K, C] per head, times scale; `extra` [N, H, E] times scale beside it
    -> [N, H, C + E] in x's dtype (w: x's dtype, or bf16 under float32 x — exact values, half the bytes).
    packed: head_pack(w), else the native op packs it per call where it runs on AMX."""
    if runs(kernel):
        return EXT.state["module"].head_matmul(
            x,
            w,
            scale,
            x.new_empty(0) if extra is None else extra,
            EXT.caps.mask,
            x.new_empty(0) if packed is None else packed,
        )
    out = torch.bmm(x.transpose(0, 1), w.to(x.dtype)).transpose(0, 1)
    if extra is not None:
        out = torch.cat((out, extra), dim=-1)
    return out * scale if scale != 1.0 else out


def rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    *,
    kernel: bool = False,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate x [N, G, d] by cos/sin [N, d/2] -> a new [N, G, d]; with slots [d/2] (int64), pair i
    by column slots[i] of cos/sin [N, F] (the native op reads them in place: no gathered copy)."""
    if runs(kernel):
        return EXT.state["module"].rope(
            x, cos, sin, interleaved, EXT.caps.mask, x.new_empty(0, dtype=torch.long) if slots is None else slots
        )
    if slots is not None:
        cos, sin = cos[:, slots], sin[:, slots]
    return apply_rope(x, cos, sin, interleaved)


def write_latent(
    cache: LatentCache,
    c: torch.Tensor,
    k_r: torch.Tensor,
    slot_mapping: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor, bool] | None = None,
    *,
    kernel: bool = False,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Store c [T, r] and k_r [T, dr] at flat slots [T] in the cache's format: the one writer of the latent
    cache (the layer's, and the decode plan's native step calls the same kernel). rope (cos, sin [T, dr/2],
    interleaved): k_r is not yet rotated, and is rotated here; else angles (cos, sin) are the ones k_r was
    rotated by (a transform-coded cache turns its rope key's mean by them). Where the route runs the native
    ops (`kernel`) and the format has a native writer, one native pass rotates, quantizes and stores (a
    transform code: one native call running the reference's torch ops, the same bits); else the reference
    rope and attention.paged.write (the format's layout in torch ops)."""
    fmt = cache.format
    if runs(kernel) and rope is not None and fmt.native_write and c.dtype == cache.dtype:
        EXT.state["module"].write_latent(c, k_r, *rope, slot_mapping, *cache.kernel_tensors(), fmt.qmax, EXT.caps.mask)
        return
    if runs(kernel) and rope is not None and fmt.coded and rope[2] == fmt.code.interleaved and c.dtype == k_r.dtype:
        module = EXT.state["module"]
        code = coded.native_code(fmt.code, module)
        module.coded_write(c, k_r, rope[0], rope[1], slot_mapping, cache.latent, cache.scale, code)
        return
    if rope is not None:
        cos, sin, interleaved = rope
        k_r = apply_rope(k_r[:, None], cos, sin, interleaved)[:, 0]
        angles = (cos, sin)
    write(cache, c, k_r, slot_mapping, angles)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *, kernel: bool = False
):
    """RMSNorm of x [T, d] (statistics in float32, one rounding, as F.rms_norm); with `residual`,
    of x + residual -> (x + residual, its norm). Without: the norm alone. The native op takes the
    flat batch (2-D: a whole-sequence [B, S, d] runs the reference)."""
    if runs(kernel) and x.dim() == 2:
        total, out = EXT.state["module"].rms_norm(
            x, weight, eps, x.new_empty(0) if residual is None else residual, EXT.caps.mask
        )
        return out if residual is None else (total, out)
    if residual is None:
        return F.rms_norm(x, weight.shape, weight, eps)
    total = x + residual
    return total, F.rms_norm(total, weight.shape, weight, eps)


def silu_mul(gate_up: torch.Tensor, *, kernel: bool = False) -> torch.Tensor:
    """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
    if runs(kernel) and gate_up.dim() == 2:
        return EXT.state["module"].silu_mul(gate_up, EXT.caps.mask)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
