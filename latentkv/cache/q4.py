"""The q4_0 cache format: llama.cpp's q4_0 blocks for the latent and the rope key.

A row of n values is cut into groups of Q4_GROUP (the last may be shorter). Each group stores a
float16 scale d = m / -8, m its value of largest magnitude (sign kept), and codes u in 0..15 for
the values (u - 8) * d: 16 levels, the extreme one exact. A group of n_g values packs into
ceil(n_g / 2) bytes, byte j holding value j in its low nibble and value j + ceil(n_g / 2) in its
high one (two contiguous runs: the decode kernel widens each with one vector loop).

The rope key is turned by a fixed orthogonal map R before it is quantized (`turn`): a converted
model's rope key carries RoPE's pairs at very different sizes, and 4 bits per value lose the small
ones. R = H·S2·P·H·S1: S1, S2 fixed sign flips, H block Walsh-Hadamard matrices (the powers of two
in dr's binary form), P a stride permutation between the two passes so every output mixes every
input. It is built once per width from those butterflies and applied as one float32 matmul
whose rows do not depend on how many there are (latentkv's fixed-order kernel where it is built:
MKL's sgemm rounds rows by M, on the AMX Xeon even padded as invariant.linear pads them); nothing
is stored with the model. Measured on the exact SmolLM2 conversion (held-out chat agreement,
float32, the cache simulated): unturned 0.80; one pass of H·S 0.88; two passes 0.905; a dense random orthogonal
matrix 0.900-0.908 (docs/conversion.md). Scores are unchanged when the query's rope part is turned
by the same R (attention/native_backend.py does, for the native kernel); `dequantize` turns the
key back for every other reader. The latent is not turned: a converted model's latent is already
mixed by a random orthogonal matrix (convert/latent.py rotate).
"""

from __future__ import annotations

import functools
import hashlib
import math

import torch

from latentkv import invariant
from latentkv.facts import Q4_GROUP, Q4_SCALE_BYTES
from latentkv.kernels import qlinear


def groups(n: int) -> int:
    """Scale groups of a row of n values."""
    return -(-n // Q4_GROUP)


def packed_bytes(n: int) -> int:
    """Code bytes of a row of n values (every group but the last is even)."""
    return -(-n // 2)


def row_bytes(n: int) -> int:
    """Bytes a row of n values takes: codes and scales."""
    return packed_bytes(n) + Q4_SCALE_BYTES * groups(n)


@functools.cache
def _plan(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(S1, S2, perm) of the turn of n values: two fixed ±1 patterns (from SHA-256:
    the same on every machine) and a stride permutation (i -> s·i mod n, s coprime with n, about
    n/3) that carries each Hadamard block's outputs into every block."""

    def signs(salt: bytes) -> torch.Tensor:
        return torch.tensor(
            [1.0 if hashlib.sha256(salt + i.to_bytes(4, "little")).digest()[0] & 1 else -1.0 for i in range(n)]
        )

    stride = next(s for s in range(max(1, n // 3), n + 1) if math.gcd(s, n) == 1) if n else 1
    perm = torch.tensor([stride * i % n for i in range(n)], dtype=torch.long)
    return signs(b"latentkv-q4-1"), signs(b"latentkv-q4-2"), perm


def _hadamard(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] -> H x along the last dim, H block-diagonal with normalized Walsh-Hadamard blocks
    of the powers of two in n (largest first); H is symmetric and orthogonal."""
    out, start, n = [], 0, x.shape[-1]
    if n == 0:
        return x
    while start < n:
        b = 1 << ((n - start).bit_length() - 1)
        y = x[..., start : start + b]
        h = 1
        while h < b:  # butterflies: pairs (i, i + h) within each 2h run
            y = y.reshape(*y.shape[:-1], b // (2 * h), 2, h)
            y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
            y = y.reshape(*x.shape[:-1], b)
            h *= 2
        out.append(y * b**-0.5)
        start += b
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


@functools.cache
def _matrix(n: int) -> torch.Tensor:
    """R [n, n] float32 (R x = H S2 P H S1 x), built once per width from the butterflies above:
    applied as one matmul, ~20x faster than the butterflies' small ops at decode's one row."""
    s1, s2, perm = _plan(n)
    rows = _hadamard(_hadamard(torch.eye(n) * s1)[..., perm] * s2)  # row i: R e_i, i.e. Rᵀ
    return rows.T.contiguous()


@functools.cache
def _packed(n: int, back: bool) -> torch.Tensor:
    """R (or Rᵀ) in the fixed-order kernel's float32 record (kernels/qlinear.py pack_f32)."""
    return qlinear.pack_f32(_matrix(n).T if back else _matrix(n))


@functools.cache
def _weight(n: int, back: bool) -> torch.Tensor:
    """R (or Rᵀ) as a linear's weight [n, depth], its columns zero-padded to a multiple of 8: sgemm
    rounded rows of K = 6 differently by M (measured); zero columns add nothing."""
    m = _matrix(n).T if back else _matrix(n)
    return torch.nn.functional.pad(m, (0, -(-n // 8) * 8 - n)).contiguous()


def _apply(x: torch.Tensor, back: bool) -> torch.Tensor:
    """x [..., n] -> R x (Rᵀ x) per row, in float32, rows independent of how many there are (invariant.linear)."""
    n = x.shape[-1]
    if n == 0:
        return x
    if x.device.type == "cpu" and qlinear.available():  # each output reduces in one order, whatever M
        return qlinear.linear(x.reshape(-1, n).float(), _packed(n, back), 32, n).view(x.shape).to(x.dtype)
    weight = _weight(n, back).to(x.device)
    rows = torch.nn.functional.pad(x.reshape(-1, n).float(), (0, weight.shape[1] - n))
    return invariant.linear(rows, weight).view(x.shape).to(x.dtype)


def turn(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] -> R x, in x's dtype (computed in float32)."""
    return _apply(x, back=False)


def turn_back(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] -> Rᵀ x."""
    return _apply(x, back=True)


def _padded(x: torch.Tensor) -> torch.Tensor:
    """[..., n] float32 -> [..., groups, Q4_GROUP], zeros past n."""
    n = x.shape[-1]
    return torch.nn.functional.pad(x, (0, groups(n) * Q4_GROUP - n)).view(*x.shape[:-1], groups(n), Q4_GROUP)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, n] -> (codes [T, packed_bytes(n)] uint8, scales [T, groups(n)] float16)."""
    t, n = x.shape
    xg = _padded(x.float())
    m = xg.gather(-1, xg.abs().argmax(-1, keepdim=True))  # the largest magnitude, its sign kept
    d = (m / -8).half()
    inv = torch.where(d != 0, 1 / d.float(), torch.zeros_like(m))
    u = (xg * inv + 8.5).floor().clamp(0, 15).to(torch.uint8).view(t, -1)[:, :n]  # [T, n] codes 0..15
    return pack(u), d.view(t, -1)


def pack(u: torch.Tensor) -> torch.Tensor:
    """codes [T, n] (0..15) -> [T, packed_bytes(n)]: per group, value j low, j + half high."""
    t, n = u.shape
    full = n // Q4_GROUP * Q4_GROUP
    body = u[:, :full].reshape(t, -1, 2, Q4_GROUP // 2)
    parts = [(body[:, :, 0] | (body[:, :, 1] << 4)).reshape(t, -1)]
    if full < n:  # the last group, shorter: an absent high value is code 8 (the value 0)
        size = n - full
        half = -(-size // 2)
        high = torch.nn.functional.pad(u[:, full + half :], (0, half - (size - half)), value=8)
        parts.append(u[:, full : full + half] | (high << 4))
    return torch.cat(parts, dim=-1)


def unpack(codes: torch.Tensor, n: int) -> torch.Tensor:
    """[..., packed_bytes(n)] -> codes [..., n] (0..15), pack's inverse."""
    full = n // Q4_GROUP * Q4_GROUP
    body = codes[..., : full // 2].unflatten(-1, (-1, Q4_GROUP // 2))
    parts = [torch.stack((body & 15, body >> 4), dim=-2).flatten(-3)]
    if full < n:
        size = n - full
        half = -(-size // 2)
        tail = codes[..., full // 2 :]
        parts += [tail & 15, (tail >> 4)[..., : size - half]]
    return torch.cat(parts, dim=-1)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, n: int, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """codes [..., packed_bytes(n)], scales [..., groups(n)] float16 -> values [..., n] in dtype
    (into `out` if given). (u - 8) * d is exact in float32 (a 4-bit integer times an fp16 scale)."""
    u = unpack(codes, n).float() - 8
    values = (_padded(u) * scales.float()[..., None]).flatten(-2)[..., :n]
    if out is None:
        return values.to(dtype)
    return out.copy_(values)
