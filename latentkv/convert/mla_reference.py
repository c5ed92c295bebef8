"""A plain forward of a converted (DeepSeek-V3-layout, all dense) model held in memory.

The converter's own check of what it wrote: it reads the same config dict and tensor
names the exporter writes, including the native `latentkv` extensions, and can quantize
the latent to int8 per token (scale = max|c| / 127) as the paged cache stores it.
Shapes: ids [B, T], hidden [B, T, D].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from latentkv.convert.reference import mlp, rms_norm


def layer_inv_freq(cfg: dict, i: int) -> torch.Tensor:
    """[dr/2] angle per token of each rope pair of layer i."""
    ext = cfg.get("latentkv") or {}
    if ext.get("rope_inv_freq"):
        return torch.tensor(ext["rope_inv_freq"][i], dtype=torch.float32)
    dr = cfg["qk_rope_head_dim"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    return 1.0 / (theta ** (torch.arange(0, dr, 2, dtype=torch.float) / dr))


def layer_rank(cfg: dict, i: int) -> int:
    """Latent width of layer i."""
    ranks = (cfg.get("latentkv") or {}).get("kv_lora_ranks")
    return ranks[i] if ranks else cfg["kv_lora_rank"]


def interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, dr] whose pair s is dims (2s, 2s+1) by cos/sin [T, dr/2]."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


def quantize_int8(c: torch.Tensor) -> torch.Tensor:
    """Round-trip c [..., r] through a per-token int8 code with scale max|c| / 127."""
    scale = c.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return (c / scale).round().clamp(-127, 127) * scale


def mla_attention(cfg: dict, t: dict, i: int, x: torch.Tensor, positions: torch.Tensor, int8: bool = False):
    """Naive-path MLA of normed input x [B,T,D] -> [B,T,D]."""
    B, T, _ = x.shape
    p = f"model.layers.{i}.self_attn."
    H, dn, dr, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    r = layer_rank(cfg, i)
    q = F.linear(x, t[p + "q_proj.weight"], t.get(p + "q_proj.bias")).view(B, T, H, dn + dr).transpose(1, 2)
    ckr = F.linear(x, t[p + "kv_a_proj_with_mqa.weight"], t.get(p + "kv_a_proj_with_mqa.bias"))
    c, k_rope = ckr.split([r, dr], -1)
    if p + "kv_a_layernorm.weight" in t:
        c = rms_norm(c, t[p + "kv_a_layernorm.weight"], cfg["rms_norm_eps"])
    if int8:
        c = quantize_int8(c)
    kv = F.linear(c, t[p + "kv_b_proj.weight"]).view(B, T, H, dn + dv).transpose(1, 2)
    k_nope, v = kv.split([dn, dv], -1)
    angles = positions.float()[:, None] * layer_inv_freq(cfg, i)[None, :]
    cos, sin = angles.cos(), angles.sin()
    q_rope = interleaved_rope(q[..., dn:], cos, sin)
    k_rope = interleaved_rope(k_rope[:, None], cos, sin).expand(B, H, T, dr)
    qq = torch.cat([q[..., :dn], q_rope], -1)
    kk = torch.cat([k_nope, k_rope], -1)
    out = F.scaled_dot_product_attention(qq, kk, v, is_causal=True, scale=(dn + dr) ** -0.5)
    return F.linear(out.transpose(1, 2).reshape(B, T, H * dv), t[p + "o_proj.weight"], t.get(p + "o_proj.bias"))


def mla_layer(cfg: dict, t: dict, i: int, h: torch.Tensor, positions: torch.Tensor, int8: bool = False):
    """Residual stream after decoder layer i."""
    p = f"model.layers.{i}."
    eps = cfg["rms_norm_eps"]
    h = h + mla_attention(cfg, t, i, rms_norm(h, t[p + "input_layernorm.weight"], eps), positions, int8)
    weights = {k: t[p + f"mlp.{k}_proj.weight"] for k in ("gate", "up", "down")}
    return h + mlp(weights, rms_norm(h, t[p + "post_attention_layernorm.weight"], eps))


@torch.no_grad()
def mla_logits(cfg: dict, t: dict, ids: torch.Tensor, int8: bool = False) -> torch.Tensor:
    """Logits [B,T,vocab] (float32) of ids [B,T] at positions 0..T-1."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    h = F.embedding(ids, t["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        h = mla_layer(cfg, t, i, h, positions, int8)
    h = rms_norm(h, t["model.norm.weight"], cfg["rms_norm_eps"])
    return F.linear(h, t.get("lm_head.weight", t["model.embed_tokens.weight"])).float()
