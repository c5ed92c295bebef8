"""What llama.cpp's `deepseek2` architecture cannot represent, refused before anything is written.

Its graph (src/models/deepseek2.cpp) has one latent rank and one rope schedule for all layers, a
kv_a norm in every layer, no attention biases, MoE in every layer from `leading_dense_block_count`
on, group-limited routing only as DeepSeek-V3 scores groups (its two best experts), YaRN with
beta_fast 32 / beta_slow 1 and truncated correction dims. Everything else latentkv serves maps
exactly (model/ and gguf_metadata.py say how).
"""

from __future__ import annotations

from latentkv.config import ModelConfig

STOCK = "convert with `latentkv convert --stock`, which writes a plain deepseek_v3 checkpoint"
# llama.cpp's deepseek2 never reads YaRN's betas from a GGUF: its defaults (llama-hparams.h)
LLAMA_CPP_BETAS = (32.0, 1.0)
# llama.cpp's deepseek2 reads no q_lora_rank for these layer counts (and vocab sizes), taking them
# for DeepSeek-V2-Lite-like models with q_proj (load_arch_hparams' `is_lite`)
LITE_LAYERS = ((26, None), (27, None), (48, 128256))


class ExportError(ValueError):
    """A folder the GGUF export cannot write as llama.cpp would run it; the message says why."""


def refusals(cfg: ModelConfig) -> list[str]:
    """Why llama.cpp's deepseek2 cannot run this model as latentkv does (empty: it can)."""
    why = []
    if cfg.kv_lora_ranks is not None and len(set(cfg.kv_lora_ranks)) > 1:
        why.append(
            f"per-layer latent ranks (latentkv.kv_lora_ranks: {min(cfg.kv_lora_ranks)}.."
            f"{max(cfg.kv_lora_ranks)}); {STOCK}"
        )
    if cfg.rope_inv_freq is not None:
        why.append(f"explicit per-layer rope frequencies (latentkv.rope_inv_freq); {STOCK}")
    if not cfg.kv_a_layernorm:
        why.append(f"no kv_a_layernorm (latentkv.kv_a_layernorm: false); {STOCK}")
    if cfg.q_bias or cfg.attention_bias:
        what = "latentkv.q_bias" if cfg.q_bias else "attention_bias"
        why.append(f"attention biases ({what}: true; e.g. a Qwen2 source): llama.cpp's deepseek2 has none")
    if cfg.qk_nope_head_dim < 1:
        why.append("qk_nope_head_dim 0: llama.cpp's deepseek2 needs at least one non-rope query/key dim")
    if cfg.q_lora_rank and any(
        cfg.num_hidden_layers == n and vocab in (None, cfg.vocab_size) for n, vocab in LITE_LAYERS
    ):
        why.append(
            f"q_lora_rank with {cfg.num_hidden_layers} layers: llama.cpp's deepseek2 reads no q_lora_rank for "
            "this layer count (it takes it for DeepSeek-V2-Lite, which has q_proj)"
        )
    why += moe_refusals(cfg) + rope_refusals(cfg)
    return why


def moe_refusals(cfg: ModelConfig) -> list[str]:
    L = cfg.num_hidden_layers
    moe = [i for i in range(L) if cfg.is_moe_layer(i)]
    if not moe:
        return []
    why = []
    if moe != list(range(moe[0], L)):
        why.append(
            f"MoE layers {moe} are not all layers from the first one on (moe_layer_freq {cfg.moe_layer_freq}): "
            "llama.cpp's deepseek2 has leading dense layers, then MoE only"
        )
    if cfg.limits_groups and cfg.topk_group < cfg.n_group and cfg.topk_method != "noaux_tc":
        why.append(
            f"topk_method {cfg.topk_method!r} with {cfg.topk_group} of {cfg.n_group} groups: llama.cpp ranks "
            "expert groups by their two best experts (DeepSeek-V3's noaux_tc), not by their best one"
        )
    if cfg.limits_groups and cfg.topk_group < cfg.n_group and cfg.n_routed_experts // cfg.n_group < 2:
        why.append(f"{cfg.n_group} groups of one expert: llama.cpp ranks a group by its two best experts")
    if cfg.routed_scaling_factor == 0:
        why.append("routed_scaling_factor 0: llama.cpp reads 0 as 'no scaling'")
    return why


def rope_refusals(cfg: ModelConfig) -> list[str]:
    s = cfg.rope_scaling
    if s.rope_type != "yarn" or s.factor == 1:
        return []
    why = []
    if s.factor < 1:
        why.append(f"YaRN factor {s.factor} below 1")
    if (s.beta_fast, s.beta_slow) != LLAMA_CPP_BETAS:
        why.append(
            f"YaRN beta_fast {s.beta_fast} / beta_slow {s.beta_slow}: llama.cpp's deepseek2 always uses "
            f"{LLAMA_CPP_BETAS[0]:g} / {LLAMA_CPP_BETAS[1]:g}"
        )
    if not s.truncate:
        why.append("YaRN with truncate: false: llama.cpp rounds the correction dims (floor / ceil)")
    return why


def check_representable(cfg: ModelConfig, where: str) -> None:
    """Raise ExportError listing every reason `cfg` cannot be written for llama.cpp's deepseek2."""
    why = refusals(cfg)
    if why:
        raise ExportError(
            f"{where}: llama.cpp's deepseek2 architecture cannot run this model as latentkv does:\n  - "
            + "\n  - ".join(why)
        )
