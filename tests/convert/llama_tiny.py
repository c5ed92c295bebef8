"""Tiny random Llama-family source folders built with transformers (the conversion's reference)."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 96
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
            tie_word_embeddings=False)
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
    cls_cfg = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}[family]
    cls_model = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM}[family]
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
