"""The fused decode-step ops (csrc/decode_ops/decode_ops.cpp): the small operations between a
layer's weight matmuls as one native call each, and the decode plan's whole-step call
(csrc/decode_ops/decode_step.h). model/fused.py holds the PyTorch reference of each op and decides
when the native one runs; model/decode_plan.py builds the plan.

ISA paths: avx512, avx2, scalar for `head_matmul`, `rms_norm`, `silu_mul` (GCC vector tiles), and
amx for `head_matmul` over bf16 (csrc/decode_ops/head_amx.h: the weight packed once by `head_pack`);
`rope` and `write_latent` have one path. LATENTKV_FUSED=0 switches the extension off.
"""
from __future__ import annotations

import torch

from .build import Extension


def probe(module, isa: int) -> list:
    """The self-check's inputs (kernels/build.py). head_matmul is compared within a float tolerance:
    its tiles may round differently from the scalar loop, correctly."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        for rows in (1, 5):
            x = torch.randn(rows, 3, 40, generator=gen).to(dt)
            w = torch.randn(3, 40, 72, generator=gen).to(dt)
            extra = torch.randn(rows, 3, 8, generator=gen).to(dt)
            none = torch.empty(0, dtype=dt)
            out.append((f"head_matmul {dt} rows={rows}", module.head_matmul(x, w, 0.3, extra, isa, none), tol))
            if dt == torch.float32:  # bf16 weights under float32 rows
                out.append((f"head_matmul bf16 w rows={rows}", module.head_matmul(x, w.bfloat16(), 0.3, extra, isa, none), tol))
            else:  # columns in 16s: the AMX path (a last step of K % 32 = 8 values), packed once and per call
                w16 = w[..., :64].contiguous()
                out.append((f"head_matmul {dt} 64 columns rows={rows}",
                            module.head_matmul(x, w16, 0.3, extra, isa, module.head_pack(w16, isa)), tol))
                out.append((f"head_matmul {dt} 64 columns unpacked rows={rows}",
                            module.head_matmul(x, w16, 0.3, extra, isa, none), tol))
        x, res = torch.randn(5, 96, generator=gen).to(dt), torch.randn(5, 96, generator=gen).to(dt)
        weight = torch.randn(96, generator=gen).to(dt)
        total, normed = module.rms_norm(x, weight, 1e-5, res, isa)
        out += [(f"rms_norm {dt} sum", total, tol), (f"rms_norm {dt}", normed, tol)]
        out.append((f"silu_mul {dt}", module.silu_mul(torch.randn(5, 2 * 48, generator=gen).to(dt), isa), tol))
    return out


EXT = Extension("decode_ops", "latentkv_decode_ops", "decode_ops.cpp", "LATENTKV_FUSED", "the fused decode ops are",
                "the PyTorch reference ops", probe)


def extension():
    """The compiled module, or None (the reason in `unavailable_reason()`); built once per process."""
    return EXT.module()


def available() -> bool:
    return EXT.available()


def unavailable_reason() -> str | None:
    return EXT.unavailable_reason()
