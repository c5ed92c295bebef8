"""Paged storage of one layer's MLA cache: the latent `c` and the shared rope key `k_r`, in the tensors
its format (cache/format.py, decided when the cache is made) lays out.

Unquantized: one tensor [num_blocks, block_size, kv_rank + rope_dim] in the model dtype,
so the absorbed path reads key rows `[c ; k_r]` with no copy.
Quantized (`int8`, `fp8_e4m3`): `c` in one byte per element with a float32 scale per
token (`scale = max|c| / qmax`), `k_r` in 16 bits (format.rope_dtype: the model dtype, bf16 for a
float32 model). The `_rope8` forms
(facts.ROPE8) store `k_r` as int8 codes with a second float32 scale per token: `scale` is then
[..., 2] (latent's, rope's), one tensor, so the kernels take the same arguments. Dequantized when
attention reads it. `q4_0` (cache/q4.py): `latent` and `rope` hold packed 4-bit codes, `scale`
float16 scales [..., groups(r) + groups(dr)] (the latent's, then the rope key's). A transform-coded
layer (cache/coded.py): `latent` its packed codes of both sides, `scale` their float16 scales, no `rope`;
its rows are read back by position (the rope key's mean turns with it). Reads and writes through block
tables live in `latentkv.attention.paged`.
"""

from __future__ import annotations

import torch

from latentkv.cache import coded, q4
from latentkv.cache.format import LATENTS, cache_format
from latentkv.facts import TRANSFORM_CODE


class LatentCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        kv_rank: int,
        rope_dim: int,
        dtype: torch.dtype = torch.float32,
        cache_dtype: str = "auto",
        device: torch.device | str = "cpu",
        code: coded.LayerCode | None = None,
    ):
        """code: a transform-coded layer's (cache_dtype facts.TRANSFORM_CODE), else None."""
        self.block_size, self.kv_rank, self.rope_dim = block_size, kv_rank, rope_dim
        self.dtype, self.cache_dtype = dtype, cache_dtype
        # what every reader and writer asks (one object per name and dtype: functools.cache)
        self.format = cache_format(cache_dtype, dtype) if code is None else cache_format(cache_dtype, dtype, code)
        self.latent_dtype, self.rope8 = self.format.latent, self.format.rope8
        self.parts = self.format.parts(kv_rank, rope_dim)
        for part in self.parts:  # kv; or latent, scale, rope
            setattr(self, part.name, torch.zeros(num_blocks, block_size, *part.shape, dtype=part.dtype, device=device))

    @property
    def quantized(self) -> bool:
        return self.format.quantized

    @property
    def q4(self) -> bool:
        """Whether the cache holds q4_0 blocks (cache/q4.py), the rope key turned."""
        return self.format.q4

    @property
    def qmax(self) -> float:
        """The largest code magnitude of a per-token scaled latent (a token's max |c| maps to it)."""
        if not self.format.qmax:  # q4_0 scales each 32 values (cache/q4.py); "auto" has no codes
            raise ValueError(f"a {self.cache_dtype} cache has no per-token code maximum")
        return self.format.qmax

    def dequantize(
        self, codes: torch.Tensor, scale: torch.Tensor, rope: torch.Tensor | None = None, positions=None
    ) -> torch.Tensor:
        """codes [..., r], scale [...] (or [..., 2] with an 8-bit rope; q4_0: cache/q4.py), rope [..., dr] ->
        [..., r + dr] in the model dtype, written in place into one buffer (no cat). A transform-coded
        layer: codes [..., code bytes], scale [..., groups], no rope, and the rows' positions [...]."""
        if self.format.coded:
            if positions is None:
                raise ValueError("a transform-coded cache is read with its rows' positions")
            lead = codes.shape[:-1]
            rows = coded.decode(
                self.format.code,
                codes.reshape(-1, codes.shape[-1]),
                scale.reshape(-1, scale.shape[-1]),
                positions.expand(lead).reshape(-1),
                self.dtype,
            )
            return rows.view(*lead, -1)
        out = torch.empty(*codes.shape[:-1], self.kv_rank + self.rope_dim, dtype=self.dtype, device=codes.device)
        if self.q4:
            split = q4.groups(self.kv_rank)
            q4.dequantize(codes, scale[..., :split], self.kv_rank, self.dtype, out=out[..., : self.kv_rank])
            rope = q4.dequantize(rope, scale[..., split:], self.rope_dim, torch.float32)
            out[..., self.kv_rank :] = q4.turn_back(rope)
            return out
        if self.rope8:
            dequantize_latent(codes, scale[..., 0], self.latent_dtype, self.dtype, out=out[..., : self.kv_rank])
            dequantize_latent(rope, scale[..., 1], "int8", self.dtype, out=out[..., self.kv_rank :])
            return out
        dequantize_latent(codes, scale, self.latent_dtype, self.dtype, out=out[..., : self.kv_rank])
        out[..., self.kv_rank :] = rope
        return out

    def tensors(self) -> list[torch.Tensor]:
        """The format's parts, in its order (the KV store saves and restores them)."""
        return [getattr(self, part.name) for part in self.parts]

    def kernel_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv, latent, scale, rope) as the native kernels take them: the parts this format lacks empty."""
        first = self.tensors()[0]
        return tuple(getattr(self, name, first.new_empty(0)) for name in ("kv", "latent", "scale", "rope"))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def quantize_latent(c: torch.Tensor, cache_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """c [T, r] -> (one-byte codes [T, r], scale [T]) with a per-token dynamic scale
    (`cache_dtype`: the latent's, "int8" or "fp8_e4m3"; the 8-bit rope key takes "int8")."""
    cf = c.float()
    scale = cf.abs().amax(dim=-1).clamp_min(1e-12) / LATENTS[cache_dtype]
    scaled = cf / scale[:, None]
    if cache_dtype == "int8":
        return scaled.round().clamp(-127, 127).to(torch.int8), scale
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantize_latent(
    q: torch.Tensor, scale: torch.Tensor, cache_dtype: str, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """codes [..., r] and scale [...] -> values [..., r] in dtype (written into `out` if given).
    Computed in `dtype`: a float32 product would cost a promoted pass ~8x slower on CPU."""
    values = torch.empty(q.shape, dtype=dtype, device=q.device) if out is None else out
    values.copy_(q if cache_dtype == "int8" else q.view(torch.float8_e4m3fn))  # exact in bf16/fp32
    return values.mul_(scale.to(dtype)[..., None])


def allocate_caches(
    cfg, num_blocks: int, block_size: int, dtype: torch.dtype, cache_dtype: str = "auto", device="cpu"
) -> list[LatentCache]:
    """One LatentCache per layer (per-layer ranks allowed; a transform code's layers from the folder's
    record, cfg.extensions["cache_format"])."""
    codes = coded.layer_codes(cfg) if cache_dtype == TRANSFORM_CODE else [None] * cfg.num_hidden_layers
    return [
        LatentCache(num_blocks, block_size, cfg.kv_rank(i), cfg.qk_rope_head_dim, dtype, cache_dtype, device, codes[i])
        for i in range(cfg.num_hidden_layers)
    ]
