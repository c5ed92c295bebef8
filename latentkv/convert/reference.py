"""A plain float32 forward of a Llama-family `SourceModel` (the conversion's reference;
the converted model runs on latentkv.model).

Used to evaluate sources, to collect calibration statistics layer by layer, and as the
ground truth of the exactness tests. Shapes: ids [B, T], hidden [B, T, D].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from latentkv.convert.source_model import SourceModel
from latentkv.model.norm import rms_norm
from latentkv.model.rope import cos_sin, rotate


def project_qkv(src: SourceModel, layer: dict, x: torch.Tensor):
    """q [B,H,T,d], k, v [B,Hkv,T,d] before RoPE, from normed input x [B,T,D]."""
    B, T, _ = x.shape
    d = src.head_dim
    q = F.linear(x, layer["q"], layer["q_bias"]).view(B, T, src.num_heads, d).transpose(1, 2)
    k = F.linear(x, layer["k"], layer["k_bias"]).view(B, T, src.num_kv_heads, d).transpose(1, 2)
    v = F.linear(x, layer["v"], layer["v_bias"]).view(B, T, src.num_kv_heads, d).transpose(1, 2)
    return q, k, v


def attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax probabilities [B, H, T, T] (k's heads repeated to q's)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1)


def attention(src: SourceModel, layer: dict, x: torch.Tensor, positions: torch.Tensor, return_probs: bool = False):
    """Self-attention output [B,T,D] of normed input x; optionally also probs [B,H,T,T]."""
    B, T, _ = x.shape
    q, k, v = project_qkv(src, layer, x)
    cos, sin = cos_sin(positions, src.inv_freq.to(x.device))  # [T, d/2], against [B, H, T, d/2]
    q, k = rotate(q, cos, sin, interleaved=False), rotate(k, cos, sin, interleaved=False)
    scale = src.head_dim ** -0.5
    if return_probs:
        probs = attention_probs(q, k, scale)
        out = probs @ v.repeat_interleave(src.num_heads // src.num_kv_heads, dim=1)
    else:
        probs = None
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    out = F.linear(out.transpose(1, 2).reshape(B, T, -1), layer["o"])
    return out, probs


def mlp(layer: dict, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP of normed input x [B,T,D]."""
    return F.linear(F.silu(F.linear(x, layer["gate"])) * F.linear(x, layer["up"]), layer["down"])


def decoder_layer(src: SourceModel, i: int, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Residual stream after layer i, hidden [B,T,D] -> [B,T,D]."""
    layer = src.layer(i)
    h = h + attention(src, layer, rms_norm(h, layer["attn_norm"], src.rms_norm_eps), positions)[0]
    return h + mlp(layer, rms_norm(h, layer["mlp_norm"], src.rms_norm_eps))


def embed(src: SourceModel, ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings [B,T,D]."""
    return F.embedding(ids, src.tensors["model.embed_tokens.weight"])


def final_hidden(src: SourceModel, ids: torch.Tensor) -> torch.Tensor:
    """Normed last hidden states [B,T,D] of ids [B,T] (positions 0..T-1)."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    h = embed(src, ids)
    for i in range(src.num_layers):
        h = decoder_layer(src, i, h, positions)
    return rms_norm(h, src.tensors["model.norm.weight"], src.rms_norm_eps)


@torch.no_grad()
def source_logits(src: SourceModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B,T,vocab] (float32) of ids [B,T]."""
    return F.linear(final_hidden(src, ids), src.lm_head())
