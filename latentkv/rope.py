"""Decoupled RoPE for MLA: frequency schedules (plain, YaRN, explicit) and rotation.

Only the `qk_rope_head_dim` part of queries and the shared rope key are rotated.
Two layouts exist in checkpoints: interleaved pairs `(x0,x1),(x2,x3),…` (DeepSeek's
own, V2 always, V3 with `rope_interleave`) and halves `(x_i, x_{i+d/2})`.
"""

from __future__ import annotations

import math

import torch

from latentkv.config import ModelConfig, RopeScaling


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(cfg: ModelConfig) -> float:
    """1/sqrt(dn+dr), times mscale(mscale_all_dim)² under YaRN, as DeepSeek does."""
    scale = cfg.qk_head_dim**-0.5
    s = cfg.rope_scaling
    if s.rope_type == "yarn" and s.mscale_all_dim:
        m = yarn_mscale(s.factor, s.mscale_all_dim)
        scale = scale * m * m
    return scale


def attention_factor(s: RopeScaling) -> float:
    """YaRN's factor on cos/sin (1 for DeepSeek's mscale == mscale_all_dim)."""
    if s.rope_type != "yarn":
        return 1.0
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    return yarn_mscale(s.factor)


def default_inv_freq(dim: int, theta: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[dim/2] the standard schedule theta^(-2i/dim), computed in `dtype` (float32, as
    transformers does; the converter's stock search uses float64). The one table of it."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))


def yarn_inv_freq(dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN: extrapolate fast frequencies, interpolate slow ones, linear ramp between."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = default_inv_freq(dim, theta)
    interpolation = extrapolation / s.factor
    keep = 1 - ramp  # 1 where the frequency is left as trained
    return interpolation * (1 - keep) + extrapolation * keep


def layer_inv_freq(cfg: ModelConfig, layer: int) -> torch.Tensor:
    """[dr/2] angular frequency of each rope pair of one layer."""
    if cfg.rope_inv_freq is not None:
        return torch.tensor(cfg.rope_inv_freq[layer], dtype=torch.float32)
    if cfg.rope_scaling.rope_type == "yarn":
        return yarn_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling)
    return default_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] and inv_freq [..., d/2] -> cos, sin [..., T, d/2] in float32."""
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[..., None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate x [T, ..., dr] by cos/sin [T, dr/2]; returns the same layout as x."""
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    return rotate(x, cos.view(shape), sin.view(shape), interleaved)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate x [..., d] by cos/sin broadcastable to [..., d/2]: interleaved pairs (2i, 2i+1)
    or halves (i, i + d/2). Computed in float32 as transformers does, then cast back."""
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        half = xf.shape[-1] // 2
        a, b = xf[..., :half], xf[..., half:]
        out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return out.to(x.dtype)
