"""A plain float32 forward of a Llama-family `SourceModel` (the conversion's reference;
the converted model runs on latentkv.model).

Used to evaluate sources, to collect calibration statistics layer by layer, and as the
ground truth of the exactness tests. Shapes: ids [B, T], hidden [B, T, D].
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from latentkv.model.norm import rms_norm
from latentkv.rope import cos_sin, rotate
from latentkv.sources.source_model import SourceModel


def project_qkv(src: SourceModel, layer: dict, x: torch.Tensor):
    """q [B,H,T,d], k, v [B,Hkv,T,d] before RoPE, from normed input x [B,T,D]."""
    B, T, _ = x.shape
    d = src.head_dim
    q = F.linear(x, layer["q"], layer["q_bias"]).view(B, T, src.num_heads, d).transpose(1, 2)
    k = F.linear(x, layer["k"], layer["k_bias"]).view(B, T, src.num_kv_heads, d).transpose(1, 2)
    v = F.linear(x, layer["v"], layer["v_bias"]).view(B, T, src.num_kv_heads, d).transpose(1, 2)
    return q, k, v


# what a KV cache does to k (after RoPE) and v [B,Hkv,T,d]: one round trip for both, or (k's, v's)
KVStore = Callable[[torch.Tensor], torch.Tensor] | tuple


def attention(
    src: SourceModel, layer: dict, x: torch.Tensor, positions: torch.Tensor, kv: KVStore | None = None
) -> torch.Tensor:
    """Self-attention output [B,T,D] of normed input x (calibrate.py computes the probabilities itself);
    kv: the round trip of a quantized KV cache, applied to k and v as a cache would store them."""
    B, T, _ = x.shape
    q, k, v = project_qkv(src, layer, x)
    cos, sin = cos_sin(positions, src.inv_freq.to(x.device))  # [T, d/2], against [B, H, T, d/2]
    q, k = rotate(q, cos, sin, interleaved=False), rotate(k, cos, sin, interleaved=False)
    if kv is not None:
        store_k, store_v = kv if isinstance(kv, tuple) else (kv, kv)
        k, v = store_k(k), store_v(v)
    scale = src.head_dim**-0.5
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    return F.linear(out.transpose(1, 2).reshape(B, T, -1), layer["o"])


def mlp(layer: dict, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP of normed input x [B,T,D]."""
    return F.linear(F.silu(F.linear(x, layer["gate"])) * F.linear(x, layer["up"]), layer["down"])


def decoder_layer(
    src: SourceModel, i: int, h: torch.Tensor, positions: torch.Tensor, kv: KVStore | None = None
) -> torch.Tensor:
    """Residual stream after layer i, hidden [B,T,D] -> [B,T,D]."""
    layer = src.layer(i)
    h = h + attention(src, layer, rms_norm(h, layer["attn_norm"], src.rms_norm_eps), positions, kv)
    return h + mlp(layer, rms_norm(h, layer["mlp_norm"], src.rms_norm_eps))


def embed(src: SourceModel, ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings [B,T,D]."""
    return F.embedding(ids, src.tensors["model.embed_tokens.weight"])


def final_hidden(src: SourceModel, ids: torch.Tensor, kv: KVStore | None = None) -> torch.Tensor:
    """Normed last hidden states [B,T,D] of ids [B,T] (positions 0..T-1)."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    h = embed(src, ids)
    for i in range(src.num_layers):
        h = decoder_layer(src, i, h, positions, kv)
    return rms_norm(h, src.tensors["model.norm.weight"], src.rms_norm_eps)


@torch.no_grad()
def source_logits(src: SourceModel, ids: torch.Tensor, kv: KVStore | None = None) -> torch.Tensor:
    """Logits [B,T,vocab] (float32) of ids [B,T]; kv: as in `attention`."""
    return F.linear(final_hidden(src, ids, kv), src.lm_head())
