"""One layer of a transform-coded latent cache (cache/transform_code.py's format) as the paged cache holds
it: per token, the codes of every stored group of both sides packed into one run of bytes, then the
groups' float16 scales.

A layer's token is `codes` uint8 [ceil(code bits / 8)] — the groups of `transform_code.groups` of the
latent, then of the rope key, each group's b-bit codes value after value, packed least significant bit
first, with no padding between values or groups — and `scale` float16 [latent groups + rope groups] in the
same order: `TransformCode.layer_bytes` in all. Centred: what is coded is the latent less its mean and the
rope key less its mean turned by the token's position (RoPE at this layer's frequencies and factor, the
model's own `rope.py`), so a reader that adds them back needs the rows' positions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from latentkv.cache import transform_code as tc
from latentkv.config import ModelConfig
from latentkv.rope import apply_rope, attention_factor, cos_sin, layer_inv_freq


@dataclass(frozen=True)
class LayerCode:
    """What one layer's cache needs of a transform code: the bits of its r latent and dr rope-key
    directions, the group, the means (None: not centred; the rope key's before RoPE) and the layer's RoPE
    (frequencies [dr/2], YaRN's factor on cos / sin, the pair layout) to turn the rope key's mean."""

    latent_bits: tuple[int, ...]
    rope_bits: tuple[int, ...]
    group: int
    latent_mean: tuple[float, ...] | None
    rope_mean: tuple[float, ...] | None
    inv_freq: tuple[float, ...]
    rope_factor: float = 1.0
    interleaved: bool = True

    @property
    def widths(self) -> list[int]:
        """Bits of every stored value, in the packed order (latent groups, then rope groups)."""
        return [
            b
            for side in (self.latent_bits, self.rope_bits)
            for b, idx in tc.groups(list(side), self.group)
            for _ in idx
        ]

    @property
    def code_bytes(self) -> int:
        return -(-sum(self.widths) // 8)

    @property
    def scales(self) -> int:
        """float16 scales a token takes: one per group of either side."""
        return len(tc.groups(list(self.latent_bits), self.group)) + len(tc.groups(list(self.rope_bits), self.group))

    @property
    def nbytes(self) -> int:
        """Bytes a token takes: TransformCode.layer_bytes of this layer."""
        return self.code_bytes + tc.SCALE_BYTES * self.scales

    def turned_mean(self, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rope key's mean turned by each token's angles cos, sin [T, dr/2] -> [T, dr] float32, as
        convert/simulated.py turns it."""
        mean = torch.tensor(self.rope_mean, dtype=torch.float32, device=cos.device)
        return apply_rope(mean.expand(cos.shape[0], 1, -1), cos, sin, self.interleaved)[:, 0]

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] -> cos, sin [N, dr/2] as the model's rope_tables gives them."""
        cos, sin = cos_sin(positions, torch.tensor(self.inv_freq, dtype=torch.float32, device=positions.device))
        return (cos, sin) if self.rope_factor == 1.0 else (cos * self.rope_factor, sin * self.rope_factor)


@functools.cache
def _layout(widths: tuple[int, ...], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(byte index, shift in it, mask) of each packed value: a value of b <= 8 bits spans two bytes at most."""
    offsets = torch.tensor([0, *widths[:-1]], dtype=torch.int64).cumsum(0)
    masks = (1 << torch.tensor(widths, dtype=torch.int32)) - 1
    return (offsets // 8).to(device), (offsets % 8).to(torch.int32).to(device), masks.to(device)


def pack(values: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """values [T, n] (codes, value j below 2^widths[j]) -> uint8 [T, ceil(sum(widths) / 8)]."""
    nbytes = -(-sum(widths) // 8)
    index, shift, _ = _layout(tuple(widths), str(values.device))
    shifted = values.to(torch.int32) << shift  # up to 15 bits: the low byte, then the next
    out = torch.zeros(values.shape[0], nbytes + 1, dtype=torch.int32, device=values.device)
    out.index_add_(1, index, shifted & 0xFF)  # the values' bits do not overlap: a sum is an or
    out.index_add_(1, index + 1, shifted >> 8)
    return out[:, :nbytes].to(torch.uint8)


def unpack(packed: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """pack's output [N, nbytes] -> the values [N, n] int32."""
    index, shift, masks = _layout(tuple(widths), str(packed.device))
    wide = torch.nn.functional.pad(packed.to(torch.int32), (0, 1))
    pair = wide.index_select(1, index) | (wide.index_select(1, index + 1) << 8)
    return (pair >> shift) & masks


def encode(code: LayerCode, c: torch.Tensor, k_r: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """c [T, r], k_r [T, dr] (after RoPE) at angles cos, sin [T, dr/2] -> (codes uint8 [T, code_bytes],
    scales float16 [T, scales]): each side less its mean (the rope key's turned), in the model's dtype as
    transform_code.round_trip subtracts it."""
    if code.latent_mean is not None:
        c = c - torch.tensor(code.latent_mean, device=c.device).to(c.dtype)
        k_r = k_r - code.turned_mean(cos, sin).to(k_r.dtype)
    parts = tc.encode(c, list(code.latent_bits), code.group) + tc.encode(k_r, list(code.rope_bits), code.group)
    if not parts:
        return c.new_zeros(c.shape[0], 0, dtype=torch.uint8), c.new_zeros(c.shape[0], 0, dtype=torch.float16)
    values = torch.cat([codes for codes, _ in parts], dim=1)
    return pack(values, code.widths), torch.stack([scale for _, scale in parts], dim=1)


def decode(
    code: LayerCode, packed: torch.Tensor, scales: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """packed [N, code_bytes], scales [N, scales] of tokens at positions [N] -> [c ; k_r] rows [N, r + dr]
    in `dtype`, the means added back as transform_code.round_trip adds them (in `dtype`)."""
    r, n = len(code.latent_bits), packed.shape[0]
    values = unpack(packed, code.widths).to(torch.uint8) if code.widths else None
    out = torch.zeros(n, r + len(code.rope_bits), dtype=dtype, device=packed.device)
    at, group_at = 0, 0  # the next value and scale of the packed order
    for bits, cols in ((code.latent_bits, slice(0, r)), (code.rope_bits, slice(r, None))):
        side = []
        for _, idx in tc.groups(list(bits), code.group):
            side.append((values[:, at : at + len(idx)], scales[:, group_at]))
            at, group_at = at + len(idx), group_at + 1
        if side:  # a side with no stored direction reads 0
            out[:, cols] = tc.decode(side, list(bits), code.group).to(dtype)
    if code.latent_mean is not None:
        out[:, :r] += torch.tensor(code.latent_mean, device=packed.device).to(dtype)
        out[:, r:] += code.turned_mean(*code.angles(positions)).to(dtype)
    return out


def layer_codes(cfg: ModelConfig) -> list[LayerCode]:
    """The folder's transform code (latentkv.cache_format) per layer, with each layer's RoPE; a folder
    without one is an error naming what it records instead."""
    code = tc.folder_code(cfg)
    if code is None:
        raise ValueError(
            f"a {tc.KIND} cache needs a folder that records one (latentkv.cache_format, convert --kv-bytes); "
            f"this one records {cfg.cache_dtype or 'no cache format'}"
        )
    out = []
    for i in range(cfg.num_hidden_layers):
        if len(code.latent_bits[i]) != cfg.kv_rank(i) or len(code.rope_bits[i]) != cfg.qk_rope_head_dim:
            raise ValueError(
                f"latentkv.cache_format: layer {i} codes {len(code.latent_bits[i])} + {len(code.rope_bits[i])} "
                f"directions, the model caches {cfg.kv_rank(i)} + {cfg.qk_rope_head_dim}"
            )
        out.append(
            LayerCode(
                code.latent_bits[i],
                code.rope_bits[i],
                code.group,
                None if code.latent_mean is None else code.latent_mean[i],
                None if code.rope_mean is None else code.rope_mean[i],
                tuple(layer_inv_freq(cfg, i).tolist()),
                attention_factor(cfg.rope_scaling),
                cfg.rope_interleave,
            )
        )
    return out
