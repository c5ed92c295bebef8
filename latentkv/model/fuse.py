"""Inference-only fusion: linears that read the same input become one matmul
(q or q_a with kv_a; gate with up), and W_UK / W_UV are laid out contiguously once. Fewer, larger matmuls per decode step. The fused
model keeps no separate q_proj / gate_proj modules, so it is for serving, not for
saving or training."""
from __future__ import annotations

import torch
from torch import nn

from .deepseek import MLP, MLAForCausalLM


def fuse_linears(linears: list[nn.Linear]) -> nn.Linear:
    """Stack the output rows of linears sharing an input; missing biases become zeros."""
    ref = linears[0].weight
    out = sum(lin.out_features for lin in linears)
    has_bias = any(lin.bias is not None for lin in linears)
    fused = nn.Linear(linears[0].in_features, out, bias=has_bias, device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([lin.weight for lin in linears]))
        if has_bias:
            fused.bias.copy_(torch.cat([lin.bias if lin.bias is not None else ref.new_zeros(lin.out_features) for lin in linears]))
    return fused


def fuse_for_inference(model: MLAForCausalLM) -> None:
    for layer in model.model.layers:
        attn = layer.self_attn
        first = "q_a_proj" if attn.q_lora_rank else "q_proj"
        parts = [getattr(attn, first), attn.kv_a_proj_with_mqa]
        attn.in_proj, attn.in_split = fuse_linears(parts), [p.out_features for p in parts]
        delattr(attn, first)
        del attn.kv_a_proj_with_mqa
        attn.absorbed = tuple(w.contiguous() for w in attn.split_kv_b())  # strided views cost a copy per call
        for mlp in (m for m in layer.modules() if isinstance(m, MLP)):
            mlp.gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj])
            del mlp.gate_proj, mlp.up_proj
