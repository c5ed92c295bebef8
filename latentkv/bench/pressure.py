"""The memory-pressure scenario of `latentkv bench serve`: every system gets the KV memory that holds
`original_tokens` tokens of the original model's own cache, then more long prompts arrive than fit.

The original's cache per token is 2 (K and V) x layers x KV heads x head dim x element bytes, in the
bench dtype; an MLA latent (and an int8 latent more so) is smaller, so the same memory admits more
requests at once."""
from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig

from latentkv.facts import MODEL_DTYPES

PRESSURE = {"original_tokens": 8192, "concurrency": [32], "max_concurrency": 32, "num_prompts": 64,
            "min_prompt": 1024, "max_prompt": 1024, "min_output": 128, "max_output": 128}


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """Bytes of a standard (MHA/GQA) KV cache per token, from a Hugging Face config's sizes."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * MODEL_DTYPES[dtype].itemsize


def original_config(source: Path) -> dict:
    """The original model's config: an HF folder's config.json, or the one transformers reads from a GGUF."""
    if source.suffix == ".gguf":
        return AutoConfig.from_pretrained(source.parent, gguf_file=source.name).to_dict()
    return AutoConfig.from_pretrained(source).to_dict()


def pressure_cache_bytes(source: Path, dtype: str, tokens: int) -> int:
    return tokens * kv_bytes_per_token(original_config(source), dtype)
