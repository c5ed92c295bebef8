"""The DeepSeek-V3 config.json of a converted model (all layers dense, one KV head per query head),
and the model it describes, built in memory: the converter measures with latentkv's own model."""

from __future__ import annotations

import torch

from latentkv.config import ModelConfig
from latentkv.model.deepseek import MLAForCausalLM
from latentkv.model.loader import model_from_tensors
from latentkv.sources.source_model import SourceModel

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def deepseek_config(
    src: SourceModel,
    dn: int,
    dr: int,
    ranks: list[int],
    stock: bool,
    theta: float | None,
    inv_freq: list[list[float]],
    dtype=torch.float32,
) -> dict:
    """config.json dict; native adds the `latentkv` extensions of docs/internals.md.

    MoE fields are set to the smallest values transformers accepts; with
    first_k_dense_replace = num_hidden_layers no layer uses them.
    """
    L = src.num_layers
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": src.vocab_size,
        "hidden_size": src.hidden_size,
        "intermediate_size": src.intermediate_size,
        "moe_intermediate_size": src.intermediate_size,
        "num_hidden_layers": L,
        "num_attention_heads": src.num_heads,
        "num_key_value_heads": src.num_heads,
        "n_shared_experts": 1,
        "n_routed_experts": 1,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        "first_k_dense_replace": L,
        "num_mtp_layers": 0,
        "kv_lora_rank": max(ranks),
        "q_lora_rank": None,
        "qk_rope_head_dim": dr,
        "qk_nope_head_dim": dn,
        "v_head_dim": src.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": src.max_position_embeddings,
        # stock: DeepSeek's 1e-6, which transformers uses for kv_a_layernorm whatever the config
        # says (see pipeline.linearize_norm); the other norms barely notice the change.
        "rms_norm_eps": 1e-6 if stock else src.rms_norm_eps,
        "rope_theta": float(theta if theta is not None else src.rope_theta),
        "rope_scaling": None,
        "rope_interleave": True,
        "attention_bias": bool(src.qkv_bias),
        "attention_dropout": 0.0,
        "tie_word_embeddings": bool(src.tie_word_embeddings) and not stock,  # stock writes lm_head (vLLM unties)
        "bos_token_id": src.bos_token_id,
        "eos_token_id": src.eos_token_id,
        "torch_dtype": DTYPE_NAMES.get(dtype, "float32"),
    }
    if not stock:
        cfg["latentkv"] = {
            "version": 1,
            "kv_a_layernorm": False,
            "kv_lora_ranks": list(ranks),
            "rope_inv_freq": inv_freq,
            "q_bias": bool(src.qkv_bias),
        }
    return cfg


def converted_model(cfg: dict, tensors: dict[str, torch.Tensor]) -> MLAForCausalLM:
    """The converted model in float32 (as `latentkv eval ppl` loads the exported folder)."""
    return model_from_tensors(ModelConfig.from_dict(cfg), tensors, torch.float32)
