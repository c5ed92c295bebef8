"""Batch invariance: a row's bits must not depend on how many rows share its matmul.

Greedy output is the same alone, batched, chunked or prefix-cached only if every token row
is computed the same way whatever else is in the step. What torch's CPU matmuls do (torch 2.13:
MKL 2024.2 for float32, oneDNN 3.12 for bf16; tests/test_invariant.py re-checks it on the
machine that runs the suite):
- bf16 linears (oneDNN) pick their kernel by M and CPU: on an AVX-512 BF16 EPYC every M >= 2
  agreed, but M = 1 takes a GEMV kernel that rounds a few outputs per 10^5 differently, and on an
  AMX Xeon the lm_head's row 0 changed bits from M = 33. So the engine's bf16 linears run the
  fixed-order kernel too (its bf16 record: vdpbf16ps on avx512_bf16, widened FMAs elsewhere), and
  the bf16 matmuls left to oneDNN (kv_b_proj, the absorb/unabsorb bmm, a model the engine does not
  own) get a second, zero row when they have one;
- float32 (MKL sgemm) rounds differently when M is 1, 2, 3, 5, 6, 7, 9, 10 or 11 (its GEMV and
  small-M kernels) and agrees for every M that is a multiple of 4 or at least 12 (bmm: per
  batch entry, the same or better) on the EPYCs; on the AMX Xeon not even then (K = 96..192 at
  M <= 4, K = 576 / 1536 / 2048 at M <= 12 differ from M = 64). So float32 (and bf16) linears run
  latentkv's fixed-order kernel (model/quant.py FixedOrderLinear, which model/route.py builds the
  engine's model with; the MoE router and the q4_0 rope turn call it too) where it is built,
  and other float32 matmuls with such an M get zero rows up to the next multiple of 4 (the padded
  rows' outputs are dropped). The kernel, not the padding, for the linears: MKL's small-M sgemm
  runs ~4x slower than its GEMV on an AVX2-only EPYC;
- RMSNorm, softmax, SiLU and argmax are row-invariant as they are, and so are the int8 / int4
  linears (kernels/qlinear.py: a fixed reduction order per output element by construction, tested
  in tests/model/test_qlinear.py; ATen's kernels, used only where it cannot build, were measured so).
Attention is made invariant by the backends (attention/torch_ref.py `tiled_latent_attention`,
the native kernel's fixed spans).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SAFE_ROWS = 12  # float32 sgemm: every M >= this (and every multiple of 4) rounds like any other


def padded_rows(m: int, dtype: torch.dtype = torch.float32) -> int:
    """The row count a matmul of m rows runs with: float32 m or the next multiple of 4; bf16 at least 2."""
    if dtype == torch.bfloat16:
        return max(m, 2)
    return m if m >= SAFE_ROWS or m % 4 == 0 else -(-m // 4) * 4


def needs_padding(x: torch.Tensor) -> bool:
    return (
        x.dtype in (torch.float32, torch.bfloat16)
        and x.device.type == "cpu"
        and padded_rows(x.shape[-2], x.dtype) != x.shape[-2]
    )


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., M, K] -> [..., padded_rows(M), K] with zero rows appended."""
    return F.pad(x, (0, 0, 0, padded_rows(x.shape[-2], x.dtype) - x.shape[-2]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear whose rows do not depend on how many there are. x [M, K] (or [K])."""
    if x.dim() != 2 or not needs_padding(x):
        return F.linear(x, weight, bias)
    return F.linear(pad_rows(x), weight, bias)[: x.shape[0]]


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm with the same guarantee: a [B, M, K], b [B, K, N] -> [B, M, N]."""
    if not needs_padding(a):
        return torch.bmm(a, b)
    return torch.bmm(pad_rows(a), b)[:, : a.shape[1]]


def _pad_input(module: nn.Module, args: tuple):
    x = args[0]
    if x.dim() != 2 or not needs_padding(x):
        return None
    module._invariant_rows = x.shape[0]
    return (pad_rows(x),) + tuple(args[1:])


def _cut_output(module: nn.Module, args: tuple, out: torch.Tensor):
    rows = module.__dict__.pop("_invariant_rows", None)
    return None if rows is None else out[:rows]


def install(model: nn.Module) -> int:
    """Make every nn.Linear of `model` row-invariant (hooks that pad small M: float32 to a multiple
    of 4, one-row bf16 to two); -> how many. Modules only get hooks, so a model someone else owns
    (healing's student, evaluated mid-training) keeps its parameters, autograd and checkpoint keys.
    The quantized and fixed-order kernels need nothing. Only 2-D inputs [M, K] are padded (the
    engine's flat batch)."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and not getattr(module, "_invariant_hooked", False):
            module.register_forward_pre_hook(_pad_input)
            module.register_forward_hook(_cut_output)
            module._invariant_hooked = True
            count += 1
    return count
