"""The `deepseek2.*` hyperparameters of a GGUF, as llama.cpp's loader reads them
(src/models/deepseek2.cpp load_arch_hparams, src/llama-model.cpp, src/llama-context.cpp).

Two things llama.cpp computes differently from DeepSeek's code are mapped exactly here:
- its q_a / kv_a norms use the model's rms_norm_eps, where DeepSeek uses 1e-6 (model/spec.py
  LATENT_NORM_EPS): `latent_scale` is the factor the rows feeding those norms are multiplied by so
  that llama.cpp's norm gives DeepSeek's (RMSNorm(k x, eps) = RMSNorm(x, eps / k²));
- its YaRN attention scale comes from `rope.scaling.yarn_log_multiplier` and
  `rope.scaling.attn_factor` by its own formula: `rope_scaling_keys` solves for the values that give
  latentkv's softmax scale and cos / sin factor (rope.py).
"""

from __future__ import annotations

import math

import gguf

from latentkv.config import ModelConfig
from latentkv.export.gguf_check import ExportError
from latentkv.rope import attention_factor, softmax_scale
from latentkv.model.spec import LATENT_NORM_EPS

ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.DEEPSEEK2]
GATING = {"softmax": gguf.ExpertGatingFuncType.SOFTMAX, "sigmoid": gguf.ExpertGatingFuncType.SIGMOID}


def latent_scale(cfg: ModelConfig) -> float:
    """The factor on the q_a / c rows that makes llama.cpp's norms (eps = rms_norm_eps) equal
    DeepSeek's (eps = LATENT_NORM_EPS): 1 when they agree."""
    return math.sqrt(cfg.rms_norm_eps / LATENT_NORM_EPS)


def add_hparams(writer: gguf.GGUFWriter, cfg: ModelConfig, name: str, file_type: gguf.LlamaFileType) -> None:
    """Everything but the tokenizer: shapes, attention, MoE, rope."""
    w = writer
    w.add_name(name)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_vocab_size(cfg.vocab_size)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    # MLA with the absorbed query is MQA: one key head [c ; k_r] of kv_lora_rank + rope dims, value c
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(1)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    w.add_q_lora_rank(cfg.q_lora_rank or 0)  # 0: attn_q (llama.cpp requires the key)
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    for key, value in rope_scaling_keys(cfg).items():
        getattr(w, key)(value)
    add_moe(w, cfg)


def add_moe(w: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """MoE keys; a dense model still needs expert_feed_forward_length and expert_shared_count."""
    L = cfg.num_hidden_layers
    moe = [i for i in range(L) if cfg.is_moe_layer(i)]
    w.add_leading_dense_block_count(moe[0] if moe else L)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size if moe else cfg.intermediate_size)
    if not moe:
        w.add_expert_shared_count(0)
        return
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    # llama.cpp's deepseek2 always has a shared expert; without one it gets a zero one (gguf_tensors)
    w.add_expert_shared_count(max(cfg.n_shared_experts, 1))
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.normalizes_topk)
    w.add_expert_gating_func(GATING[cfg.scoring_func])
    if cfg.limits_groups and cfg.topk_group < cfg.n_group:  # all groups kept: no limit (llama.cpp wants fewer)
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)


def rope_scaling_keys(cfg: ModelConfig) -> dict[str, object]:
    """GGUFWriter method -> value for the rope scaling keys.

    latentkv multiplies cos / sin by F (attention_factor) and scores by S / sqrt(dk) (softmax_scale).
    llama.cpp's deepseek2, with factor f, 0.1·L written as yarn_log_multiplier and A as
    rope.scaling.attn_factor, multiplies cos / sin by A and scores by A²(1 + 0.1·L·ln f)² / sqrt(dk)
    when L != 0 (llama-context.cpp cancels its own mscale, deepseek2.cpp builds kq_scale); with
    L = 0 it is cos / sin A(1 + 0.1·ln f) and scores A²(1 + 0.1·ln f)² / sqrt(dk). DeepSeek's configs
    (mscale == mscale_all_dim) give A = 1, L = mscale_all_dim: what convert_hf_to_gguf writes.
    """
    s = cfg.rope_scaling
    F, S = attention_factor(s), softmax_scale(cfg) * math.sqrt(cfg.qk_head_dim)
    if s.rope_type != "yarn" or s.factor == 1:  # plain rope: cos / sin A, scores A² / sqrt(dk)
        if not math.isclose(S, F * F, rel_tol=1e-6):
            raise ExportError(
                f"rope scaling {s}: a cos/sin factor {F:g} with a softmax scale of {S:g}/sqrt(dk) "
                "has no llama.cpp equivalent without YaRN"
            )
        return {} if F == 1 else {"add_rope_scaling_attn_factors": F}
    log_f = math.log(s.factor)
    keys = {
        "add_rope_scaling_type": gguf.RopeScalingType.YARN,
        "add_rope_scaling_factor": s.factor,
        "add_rope_scaling_orig_ctx_len": s.original_max_position_embeddings,
        "add_rope_scaling_yarn_beta_fast": s.beta_fast,
        "add_rope_scaling_yarn_beta_slow": s.beta_slow,
    }
    log_mul = (math.sqrt(S) / F - 1) / (0.1 * log_f)
    if abs(log_mul) < 1e-6:
        A = F / (1 + 0.1 * log_f)
    else:
        A = F
        keys["add_rope_scaling_yarn_log_mul"] = 0.1 * log_mul  # llama.cpp divides it by 0.1 when loading
    if A != 1:
        keys["add_rope_scaling_attn_factors"] = A
    return keys
