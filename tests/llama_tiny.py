"""Tiny random Llama-family source folders built with transformers (the conversion's reference), and
the same models as GGUF files written the way llama.cpp lays them out."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 96
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)
KINDS = {
    "llama_gqa": ("llama", dict(num_key_value_heads=2, rope_theta=10000.0)),
    "llama_mha": ("llama", dict(num_key_value_heads=4, rope_theta=500.0, tie_word_embeddings=True)),
    "qwen2_bias": ("qwen2", dict(num_key_value_heads=2, rope_theta=10000.0)),
    "mistral": ("mistral", dict(num_key_value_heads=1, sliding_window=None, rope_theta=10000.0)),
}


def build(kind: str, **overrides):
    """A random transformers model of this kind (norm weights and biases perturbed)."""
    import transformers

    family, extra = KINDS[kind]
    cls_cfg = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[family]
    cls_model = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }[family]
    torch.manual_seed(0)
    model = cls_model(cls_cfg(**{**BASE, **extra, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return model


def save(kind: str, folder: Path, **overrides):
    """Save a tiny model of this kind as safetensors; returns the transformers model."""
    model = build(kind, **overrides)
    model.save_pretrained(str(folder), safe_serialization=True)
    return model


NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf permutation of Q / K rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, skip: str | None = None) -> None:
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    tensors = {
        "token_embd.weight": model.model.embed_tokens.weight,
        "output_norm.weight": model.model.norm.weight,
        "output.weight": model.lm_head.weight,
    }
    for name, p in model.model.layers.named_parameters():
        i, rest = name.split(".", 1)
        w = p.detach()
        if rest == "self_attn.q_proj.weight":
            w = permute(w, cfg.num_attention_heads)
        elif rest == "self_attn.k_proj.weight":
            w = permute(w, cfg.num_key_value_heads)
        tensors[f"blk.{i}.{NAMES[rest]}"] = w
    for name, w in tensors.items():
        if name != skip:
            writer.add_tensor(name, w.detach().float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
