"""Perplexity over non-overlapping windows: every window of `ctx` tokens is scored from
its own start (no context carried across windows), and the first token of a window is
not predicted. PPL = exp(mean negative log-likelihood over the predicted tokens)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from latentkv.facts import MLA_MODEL_TYPES

PROTOCOL = ("non-overlapping windows of {ctx} tokens, each scored from its own start; "
            "the first token of each window is not predicted; ppl = exp(mean NLL)")


def window_ids(ids: list[int], ctx: int, max_windows: int | None = None) -> torch.Tensor:
    """[N, ctx] windows of a token list (the tail shorter than ctx is dropped)."""
    n = len(ids) // ctx
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        raise ValueError(f"text too short: {len(ids)} tokens, need at least one window of {ctx}")
    return torch.tensor(ids[: n * ctx]).view(n, ctx)


@torch.no_grad()
def perplexity(logits_fn: Callable[[torch.Tensor], torch.Tensor], windows: torch.Tensor, batch: int = 1,
               desc: str = "perplexity") -> dict:
    """{"ppl", "nll", "tokens", "ctx"} of logits_fn(ids [B, T]) -> [B, T, vocab] over windows [N, T]."""
    total, count = 0.0, 0
    for b in tqdm(range(0, windows.shape[0], batch), desc=desc, unit="window", leave=False):
        ids = windows[b:b + batch]
        logits = logits_fn(ids).float()
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
        count += ids[:, 1:].numel()
    return {"ppl": math.exp(total / count), "nll": total / count, "tokens": count, "ctx": windows.shape[1]}


def is_mla_folder(path: Path) -> bool:
    """Whether a path is a DeepSeek-V2/V3-layout folder (ours or DeepSeek's)."""
    cfg = path / "config.json"
    return path.is_dir() and cfg.is_file() and json.loads(cfg.read_text()).get("model_type") in MLA_MODEL_TYPES


def model_scorer(path: str | Path | None, cache_dtype: str = "auto", quantization: str | None = None,
                 dtype: str = "float32"):
    """(logits_fn(ids [B,T]) -> [B,T,V], tokenizer, kind) for a source or an MLA folder.

    MLA folders run latentkv's own model (`load_model`, full-sequence forward through the
    latent cache, `cache_dtype` int8 / fp8_e4m3 to quantize it, `quantization` int8 / int4 for
    weight-only quantized linears, as served); GGUF files and Hugging Face
    Llama-family folders run the converter's plain reference forward.
    """
    from transformers import AutoTokenizer

    if path is not None and is_mla_folder(Path(path)):
        from latentkv.model.loader import load_model

        model = load_model(path, dtype=getattr(torch, dtype))
        if quantization:
            from latentkv.model.quant import quantize_linears
            quantize_linears(model, quantization)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        return (lambda ids: model.full_logits(ids, cache_dtype=cache_dtype)), tokenizer, "mla (latentkv model)"
    if cache_dtype != "auto" or quantization or dtype != "float32":
        raise ValueError("--cache-dtype, --quantization and --dtype apply to MLA models only")
    from latentkv.convert.reference import source_logits
    from latentkv.convert.sources import read_source

    src = read_source(path)
    return (lambda ids: source_logits(src, ids)), src.tokenizer(), f"source ({src.kind} {src.arch}, reference forward)"


def evaluate(model: str | Path | None, texts: list[str] | None = None, ctx: int = 512,
             max_tokens: int | None = None, cache_dtype: str = "auto", quantization: str | None = None,
             dtype: str = "float32") -> dict:
    """Perplexity of a model (None: the bundled SmolLM2) on text files (None: the default held-out text).

    Returns {"ppl", "nll", "tokens", "ctx", "windows", "model", "text", "protocol"}.
    """
    from latentkv.convert.corpus import heldout_text

    logits_fn, tokenizer, kind = model_scorer(model, cache_dtype, quantization, dtype)
    if texts:
        text = "\n\n".join(Path(t).read_text(encoding="utf-8") for t in texts)
        where = ", ".join(map(str, texts))
    else:
        text, where = heldout_text(), "default held-out text (Python docs, never used for calibration)"
    ids = tokenizer.encode(text, add_special_tokens=False)
    windows = window_ids(ids, ctx, None if max_tokens is None else max(1, max_tokens // ctx))
    result = perplexity(logits_fn, windows)
    return {**result, "windows": windows.shape[0], "model": f"{model or 'bundled SmolLM2 GGUF'} [{kind}]",
            "text": where, "protocol": PROTOCOL.format(ctx=ctx)}
