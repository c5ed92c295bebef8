"""Tiny random DeepSeek-V2/V3 checkpoints built with transformers (the numerics reference).

Norm weights are perturbed (not all ones) and V3's e_score_correction_bias is random, so
parity tests exercise every parameter.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

VOCAB = 128
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    max_position_embeddings=512,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
)
MOE = dict(
    moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 64,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}

# name -> (transformers config class, overrides)
CONFIGS = {
    "v2_dense": ("v2", dict(first_k_dense_replace=3)),
    # rms_norm_eps far from 1e-6: the q_a / kv_a norms must keep their own 1e-6
    "v3_dense_qlora": ("v3", dict(first_k_dense_replace=3, q_lora_rank=24, rms_norm_eps=1e-2)),
    "v2_moe_group_limited": ("v2", dict(MOE, topk_method="group_limited_greedy", n_group=4, topk_group=2)),
    "v3_moe_sigmoid": ("v3", dict(MOE, n_group=4, topk_group=2, q_lora_rank=24)),
    "v2_yarn": ("v2", dict(MOE, rope_parameters=YARN, max_position_embeddings=2560)),
    "v3_yarn_halves_tied": (
        "v3",
        dict(first_k_dense_replace=3, rope_parameters=YARN, rope_interleave=False, tie_word_embeddings=True),
    ),
    # DeepSeek-V2-Lite's MoE scaled down (64 -> 16 routed experts, 6 per token, 2 shared; softmax, greedy top-k),
    # and V3's routing on the same shape (sigmoid, noaux_tc over 4 groups, normalized, scaled)
    "v2_lite_moe": (
        "v2",
        dict(MOE, n_routed_experts=16, num_experts_per_tok=6, n_shared_experts=2, topk_method="greedy"),
    ),
    "v3_lite_moe": (
        "v3",
        dict(
            MOE,
            n_routed_experts=16,
            num_experts_per_tok=6,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
        ),
    ),
}


def build_hf_model(name: str, seed: int = 0):
    kind, overrides = CONFIGS[name]
    torch.manual_seed(seed)
    cls_cfg, cls_model = (
        (DeepseekV2Config, DeepseekV2ForCausalLM) if kind == "v2" else (DeepseekV3Config, DeepseekV3ForCausalLM)
    )
    model = cls_model(cls_cfg(**{**BASE, **overrides})).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.2)
        for layer in model.model.layers:
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(torch.randn_like(bias) * 0.1)
    return model


def save_hf_model(name: str, folder: Path, seed: int = 0):
    model = build_hf_model(name, seed)
    model.save_pretrained(folder)
    return model
