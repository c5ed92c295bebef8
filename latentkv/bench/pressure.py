"""The memory-pressure scenario of `latentkv bench serve`: every system gets the KV memory that holds
`original_tokens` tokens of the original model's own cache, then more long prompts arrive than fit.

The original's cache per token is 2 (K and V) x layers x KV heads x head dim x element bytes, in the
bench dtype, from the original's config (--source), else from the shape the conversion recorded of
its source; an MLA latent (and an int8 latent more so) is smaller, so the same memory admits more
requests at once."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig

from latentkv.bench.memory import source_shape
from latentkv.config import ModelConfig
from latentkv.facts import MODEL_DTYPES

PRESSURE = {
    "original_tokens": 8192,
    "concurrency": [32],
    "max_concurrency": 32,
    "num_prompts": 64,
    "min_prompt": 1024,
    "max_prompt": 1024,
    "min_output": 128,
    "max_output": 128,
}


def config_shape(config: dict) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) from a Hugging Face config's sizes."""
    heads = config["num_attention_heads"]
    return (
        config["num_hidden_layers"],
        config.get("num_key_value_heads") or heads,
        config.get("head_dim") or config["hidden_size"] // heads,
    )


def kv_bytes_per_token(shape: tuple[int, int, int], dtype: str) -> int:
    """Bytes of a standard (MHA/GQA) KV cache per token: K and V of every layer."""
    layers, kv_heads, head_dim = shape
    return 2 * layers * kv_heads * head_dim * MODEL_DTYPES[dtype].itemsize


def original_config(source: Path) -> dict:
    """The original model's config: an HF folder's config.json, or the one transformers reads from a GGUF."""
    if source.suffix == ".gguf":
        return AutoConfig.from_pretrained(source.parent, gguf_file=source.name).to_dict()
    return AutoConfig.from_pretrained(source).to_dict()


def original_shape(model: Path, source: Path | None) -> tuple[int, int, int]:
    if source is not None:
        return config_shape(original_config(source))
    shape = source_shape(model, ModelConfig.from_file(model / "config.json"))
    if shape is None:
        raise SystemExit(f"--scenario pressure: {model} records no source shape; pass --source (the original model)")
    return shape


def pressure_cache_bytes(model: Path, source: Path | None, dtype: str, tokens: int) -> int:
    return tokens * kv_bytes_per_token(original_shape(model, source), dtype)
