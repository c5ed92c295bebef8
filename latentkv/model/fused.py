"""Fused decode-step ops: the small operations between a layer's weight matmuls as one native
call each (csrc/decode_ops.cpp), with the PyTorch reference of each op beside it.

At batch 1 and short context a decode step is mostly per-op overhead: dozens of small eager ops
per layer, and the absorbed query / value bmm's that oneDNN runs at ~2 GFLOP/s for one row
(docs/benchmarks-history.md, "Where a decode step goes"). The native ops:
- `head_matmul`: per head x·W (W_UKᵀ q_nope beside the rotated q_rope, times the softmax scale;
  W_UV o_lat), float32 accumulation in a fixed order per row: batch-invariant by construction;
- `rope`: rotate q's rope part in one pass;
- `write_latent`: rope on k_r + quantization (int8 / fp8, scale per token) + the paged write;
- `silu_mul`: SwiGLU's silu(gate) * up;
- `rms_norm`: RMSNorm, with the residual add before it (one pass instead of ~8 ops).
They run only for CPU tensors in float32 / bfloat16 without autograd (healing trains through the
reference). Built like the attention kernel (attention/native.py: same cache directory, same
ninja); `LATENTKV_FUSED=0` switches them off (the reference ops, on purpose), and a machine where
they cannot be built uses the reference ops with one warning.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention import native
from ..attention.paged import write
from ..cache.latent_cache import LatentCache
from .rope import apply_rope

CSRC = Path(__file__).parent / "csrc"
_state: dict = {}
_lock = threading.Lock()  # one build per process, even when a background thread started it


def extension():
    """The compiled module, or None (the reason in `unavailable_reason()`); built once per process."""
    return native.lazy_build(_state, _lock, _build)


def _build(state: dict) -> None:
    build_optional(state, "LATENTKV_FUSED", "latentkv_decode_ops", CSRC / "decode_ops.cpp", "the fused decode ops",
                   "the PyTorch reference ops")


def build_optional(state: dict, switch: str, name: str, source: Path, what: str, fallback: str) -> None:
    """Build (or load the cached build of) one optional extension of latentkv/model into
    state["module"] and state["isa"]; where it cannot be (no compiler, a failed build, `switch`=0)
    state["module"] is None, state["reason"] says why, and one warning names the `fallback` that
    runs instead (none when the switch turned it off on purpose)."""
    state["module"], state["reason"] = None, None
    try:
        if os.environ.get(switch, "1") == "0":
            raise RuntimeError(f"disabled by {switch}=0")
        directory = native.build_dir() / name.removeprefix("latentkv_")
        if not (directory / f"{name}.so").exists():  # a first build takes ~30-60 s: say so
            print(f"latentkv: building {what} into {directory} (once)", file=sys.stderr, flush=True)
        state["module"] = native.compile_extension(name, source, directory, CSRC)
        state["isa"] = pick_isa(state["module"])
    except Exception as err:  # no compiler, a failed build: the fallback takes over
        state["module"] = None
        state["reason"] = native.failure_reason(err)
        if f"{switch}=0" not in state["reason"]:
            warnings.warn(f"latentkv: {what} are unavailable ({state['reason']}); using {fallback} (correct, slower)",
                          RuntimeWarning, stacklevel=3)


def pick_isa(module) -> int:
    """The instruction set for head_matmul, silu_mul and rms_norm: LATENTKV_CPU_ISA if set (as for the attention kernel), else the best."""
    codes = set(module.supported_isas())
    forced = os.environ.get("LATENTKV_CPU_ISA")
    if forced:
        if forced not in native.ISAS or native.ISAS[forced] not in codes:
            raise ValueError(f"LATENTKV_CPU_ISA={forced!r}: this CPU runs only "
                             f"{[n for n, c in native.ISAS.items() if c in codes]}")
        return native.ISAS[forced]
    return max(codes)


def available() -> bool:
    return extension() is not None


def unavailable_reason() -> str | None:
    extension()
    return _state["reason"]


def usable(x: torch.Tensor) -> bool:
    """The native ops apply: a CPU float32/bf16 activation, no autograd, and the extension built."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)
            and not torch.is_grad_enabled() and available())


def head_matmul(x: torch.Tensor, w: torch.Tensor, scale: float = 1.0, extra: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, H, K] · w [H, K, C] per head, times scale; `extra` [N, H, E] times scale beside it
    -> [N, H, C + E] in x's dtype (w: x's dtype, or bf16 under float32 x — exact values, half the bytes)."""
    if usable(x):
        return extension().head_matmul(x, w, scale, x.new_empty(0) if extra is None else extra, _state["isa"])
    out = torch.bmm(x.transpose(0, 1), w.to(x.dtype)).transpose(0, 1)
    if extra is not None:
        out = torch.cat((out, extra), dim=-1)
    return out * scale if scale != 1.0 else out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate x [N, G, d] by cos/sin [N, d/2] -> a new [N, G, d]."""
    if usable(x):
        return extension().rope(x, cos, sin, interleaved)
    return apply_rope(x, cos, sin, interleaved)


def write_latent(cache: LatentCache, c: torch.Tensor, k_r: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool, slot_mapping: torch.Tensor) -> None:
    """Store c [T, r] and k_r [T, dr] (not yet rotated: rotated here) at flat slots [T], quantized
    if the cache is: one pass (the native op), else the reference rope + attention.paged.write."""
    if usable(c) and c.dtype == cache.dtype:
        empty = c.new_empty(0)
        if cache.quantized:
            extension().write_latent(c, k_r, cos, sin, interleaved, slot_mapping, empty, cache.latent, cache.scale,
                                     cache.rope, cache.qmax)
        else:
            extension().write_latent(c, k_r, cos, sin, interleaved, slot_mapping, cache.kv, empty, empty, empty, 0.0)
        return
    write(cache, c, apply_rope(k_r[:, None], cos, sin, interleaved)[:, 0], slot_mapping)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of x [T, d] (statistics in float32, one rounding, as F.rms_norm); with `residual`,
    of x + residual -> (x + residual, its norm). Without: the norm alone."""
    if usable(x) and x.dim() == 2 and weight.dtype in (torch.float32, torch.bfloat16):
        total, out = extension().rms_norm(x, weight, eps, x.new_empty(0) if residual is None else residual, _state["isa"])
        return out if residual is None else (total, out)
    if residual is None:
        return F.rms_norm(x, weight.shape, weight, eps)
    total = x + residual
    return total, F.rms_norm(total, weight.shape, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
    if usable(gate_up) and gate_up.dim() == 2:
        return extension().silu_mul(gate_up, _state["isa"])
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
