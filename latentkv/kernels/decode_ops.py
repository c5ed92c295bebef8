"""The fused decode-step ops (csrc/decode_ops/decode_ops.cpp): the small operations between a
layer's weight matmuls as one native call each, and the decode plan's whole-step call
(csrc/decode_ops/decode_step.cpp). model/fused.py holds the PyTorch reference of each op and decides
when the native one runs; model/decode_plan.py builds the plan.

Paths: avx512, avx2, scalar for `head_matmul`, `rms_norm`, `silu_mul` (GCC vector tiles), and
amx_bf16 for `head_matmul` over bf16 (csrc/decode_ops/head_amx.h: the weight packed once by `head_pack`);
`rope` and `write_latent`'s row loops for avx512, avx2, scalar (the same bits on each); each path's
loops are a unit of their own (csrc/decode_ops/decode_ops_<isa>.cpp). Every op takes the capabilities
that serve (EXT.caps.mask, kernels/build.py) as its `caps`.
LATENTKV_FUSED=0 switches the extension off.
"""

from __future__ import annotations

import torch

from .build import Extension


def probe(module, caps: int) -> list:
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
            out.append((f"head_matmul {dt} rows={rows}", module.head_matmul(x, w, 0.3, extra, caps, none), tol))
            if dt == torch.float32:  # bf16 weights under float32 rows
                out.append(
                    (
                        f"head_matmul bf16 w rows={rows}",
                        module.head_matmul(x, w.bfloat16(), 0.3, extra, caps, none),
                        tol,
                    )
                )
            else:  # columns in 16s: the AMX path (a last step of K % 32 = 8 values), packed once and per call
                w16 = w[..., :64].contiguous()
                out.append(
                    (
                        f"head_matmul {dt} 64 columns rows={rows}",
                        module.head_matmul(x, w16, 0.3, extra, caps, module.head_pack(w16, caps)),
                        tol,
                    )
                )
                out.append(
                    (
                        f"head_matmul {dt} 64 columns unpacked rows={rows}",
                        module.head_matmul(x, w16, 0.3, extra, caps, none),
                        tol,
                    )
                )
        x, res = torch.randn(5, 96, generator=gen).to(dt), torch.randn(5, 96, generator=gen).to(dt)
        weight = torch.randn(96, generator=gen).to(dt)
        total, normed = module.rms_norm(x, weight, 1e-5, res, caps)
        out += [(f"rms_norm {dt} sum", total, tol), (f"rms_norm {dt}", normed, tol)]
        out.append((f"silu_mul {dt}", module.silu_mul(torch.randn(5, 2 * 48, generator=gen).to(dt), caps), tol))
        out += [(label, value, 0.0) for label, value in rope_and_write(module, caps, dt, gen)]
    return out


def rope_and_write(module, caps: int, dtype: torch.dtype, gen: torch.Generator) -> list:
    """rope's and write_latent's outputs (into an int8 latent with an int8 rope key, and a plain one) on
    fixed random inputs: every path's bits equal the scalar path's (their loops are not contracted)."""
    x = torch.randn(6, 3, 40, generator=gen).to(dtype)
    cos, sin = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    none = x.new_empty(0)
    out = [(f"rope {dtype} {il}", module.rope(x[..., 8:24], cos, sin, il, caps, none.long())) for il in (True, False)]
    out.append(
        (f"rope {dtype} slots", module.rope(x[..., 8:24], cos, sin, True, caps, torch.tensor([5, 0, 7, 1, 1, 2, 6, 3])))
    )
    c, k_r, slots = x[:, 0, :24] * 5, x[:, 1, :16], torch.tensor([7, 0, 3, 12, 5, 9])
    latent, scale = torch.zeros(16, 24, dtype=torch.int8), torch.zeros(16, 2)
    rope, plain = torch.zeros(16, 16, dtype=torch.int8), torch.zeros(16, 40, dtype=dtype)
    module.write_latent(c, k_r, cos, sin, True, slots, none, latent, scale, rope, 127.0, caps)
    module.write_latent(c, k_r, cos, sin, False, slots, plain, none, none, none, 0.0, caps)
    return out + [
        (f"write_latent {dtype} int8", torch.cat((latent.float(), rope.float(), scale), dim=1)),
        (f"write_latent {dtype}", plain),
    ]


EXT = Extension(
    "decode_ops",
    "latentkv_decode_ops",
    "decode_ops.cpp",
    "LATENTKV_FUSED",
    "the fused decode ops are",
    "the PyTorch reference ops",
    probe,
)


def extension():
    """The compiled module, or None (the reason in `unavailable_reason()`); built once per process."""
    return EXT.module()


def available() -> bool:
    return EXT.available()


def unavailable_reason() -> str | None:
    return EXT.unavailable_reason()
