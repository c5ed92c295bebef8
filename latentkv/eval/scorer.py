"""A model as a scorer: a source (GGUF, Llama-family HF folder) or an MLA folder as a logits function,
and its perplexity on text by the protocol of perplexity.py (what `latentkv eval ppl` prints)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from latentkv.eval.perplexity import PROTOCOL, perplexity, text_windows
from latentkv.facts import MLA_MODEL_TYPES
from latentkv.model.loader import load_model
from latentkv.sources.corpus import heldout_text
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits


def is_mla_folder(path: Path) -> bool:
    """Whether a path is a DeepSeek-V2/V3-layout folder (ours or DeepSeek's)."""
    cfg = path / "config.json"
    return path.is_dir() and cfg.is_file() and json.loads(cfg.read_text()).get("model_type") in MLA_MODEL_TYPES


def model_scorer(
    path: str | Path | None, cache_dtype: str = "auto", quantization: str | None = None, dtype: str = "float32"
):
    """(logits_fn(ids [B,T]) -> [B,T,V], tokenizer, kind) for a source or an MLA folder.

    MLA folders run latentkv's own model (`load_model`, full-sequence forward through the
    latent cache, `cache_dtype` int8 / fp8_e4m3 to quantize it, `quantization` int8 / int4 for
    weight-only quantized linears, as served); GGUF files and Hugging Face
    Llama-family folders run the converter's plain reference forward.
    """
    if path is not None and is_mla_folder(Path(path)):
        model = load_model(path, dtype=getattr(torch, dtype), quantization=quantization)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        cache_dtype = model.config.served_cache_dtype(cache_dtype)  # "auto": the folder's own, as served
        return (
            (lambda ids: model.full_logits(ids, cache_dtype=cache_dtype)),
            tokenizer,
            f"mla (latentkv model, cache {cache_dtype})",
        )
    if cache_dtype != "auto" or quantization or dtype != "float32":
        raise ValueError("--cache-dtype, --quantization and --dtype apply to MLA models only")
    src = read_source(path)
    return (lambda ids: source_logits(src, ids)), src.tokenizer(), f"source ({src.kind} {src.arch}, reference forward)"


def evaluate(
    model: str | Path | None,
    texts: list[str] | None = None,
    ctx: int = 512,
    max_tokens: int | None = None,
    cache_dtype: str = "auto",
    quantization: str | None = None,
    dtype: str = "float32",
) -> dict:
    """Perplexity of a model (None: the bundled SmolLM2) on text files (None: the default held-out text).

    Returns {"ppl", "nll", "tokens", "ctx", "windows", "model", "text", "protocol"}.
    """
    logits_fn, tokenizer, kind = model_scorer(model, cache_dtype, quantization, dtype)
    if texts:
        text = "\n\n".join(Path(t).read_text(encoding="utf-8") for t in texts)
        where = ", ".join(map(str, texts))
    else:
        text, where = heldout_text(), "default held-out text (Python docs, never used for calibration)"
    windows = text_windows(tokenizer, text, ctx, max_tokens)
    result = perplexity(logits_fn, windows)
    return {
        **result,
        "windows": windows.shape[0],
        "model": f"{model or 'bundled SmolLM2 GGUF'} [{kind}]",
        "text": where,
        "protocol": PROTOCOL.format(ctx=ctx),
    }
