"""`convert(source, out, options)`: read a source, calibrate, convert, measure, write the folder."""
from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import torch

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.corpus import default_documents, file_documents, heldout_text, token_windows
from latentkv.convert.export import export
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, resolve_rope_dim
from latentkv.convert.reference import source_logits
from latentkv.convert.source_model import SourceModel
from latentkv.convert.sources import read_source
from latentkv.eval.perplexity import PROTOCOL, perplexity, text_windows
from latentkv.facts import MODEL_DTYPES

DEFAULTS = ConvertOptions()
# With no size option: the smallest cache (int8 latent bytes counted) measured within +5%
# perplexity of the original SmolLM2 in docs/conversion.md. (Here, beside `convert`: the
# start-up cache key hashes this module's DEFAULT_* with convert's defaults.)
DEFAULT_ROPE_DIM = 64
DEFAULT_CACHE_RATIO = 5 / 6  # rope 64 + rank 256 = 320 of 384 elements: +4.6% (int8 latent +4.6%)


def split_cache(src: SourceModel, cache_ratio: float, rope_dim) -> tuple[int | str, int]:
    """(rope_dim, kv_rank) for a cache of cache_ratio × the source's elements per token."""
    total = round(cache_ratio * src.kv_elements())
    if rope_dim is None:
        rope_dim = min(DEFAULT_ROPE_DIM, src.num_kv_heads * src.head_dim) if total >= 128 else 32
        rope_dim = min(rope_dim, max(2, (total // 3) // 2 * 2))
    dr = src.num_kv_heads * src.head_dim if rope_dim == "all" else int(rope_dim)
    if total - dr < 1:
        raise ValueError(f"cache ratio {cache_ratio} leaves no room for a latent next to rope dim {dr}")
    return rope_dim, total - dr


def resolve_sizes(src: SourceModel, options: ConvertOptions) -> ConvertOptions:
    """The options (checked) with rope_dim and kv_rank decided (none given: the measured default)."""
    if options.stock and src.qkv_bias:
        raise ValueError("the stock deepseek_v3 format has no q_proj bias; convert this source without --stock")
    rope_dim, kv_rank, ratio = options.rope_dim, options.kv_rank, options.cache_ratio
    if ratio is None and kv_rank is None and rope_dim is None:
        ratio = DEFAULT_CACHE_RATIO
    if ratio is not None:
        rope_dim, kv_rank = split_cache(src, float(ratio), rope_dim)
    if rope_dim is None:
        rope_dim = min(DEFAULT_ROPE_DIM, src.num_kv_heads * src.head_dim)
    return replace(options, rope_dim=rope_dim, kv_rank="full" if kv_rank is None else kv_rank, cache_ratio=ratio)


def calibration_windows(src: SourceModel, calib, calib_tokens: int, ctx: int) -> torch.Tensor:
    """[N, ctx] calibration windows from user files or the default corpus (calibration split)."""
    docs = file_documents(calib) if calib else list(default_documents(heldout=False))
    return token_windows(src.tokenizer(), docs, ctx, calib_tokens, seed=0)


def measure(src: SourceModel, cfg: dict, tensors: dict, eval_tokens: int, ctx: int) -> dict:
    """Held-out perplexities of the source and the converted model, with the protocol and
    windows of `latentkv eval ppl` (the converted model is latentkv's own, as it loads)."""
    windows = text_windows(src.tokenizer(), heldout_text(), ctx, eval_tokens)
    model = converted_model(cfg, tensors)
    source = perplexity(lambda ids: source_logits(src, ids), windows, desc="perplexity (source)")
    converted = perplexity(model.full_logits, windows, desc="perplexity (converted)")
    return {"source ppl": source["ppl"], "converted ppl": converted["ppl"],
            "ratio": converted["ppl"] / source["ppl"],
            "protocol": PROTOCOL.format(ctx=ctx) + f", {source['tokens']} tokens of the default held-out text"}


def convert(source=None, out="converted", options: ConvertOptions = DEFAULTS) -> Path:
    """Convert a Llama-family model (GGUF or HF folder; None: bundled SmolLM2) to MLA in `out`."""
    options.check()
    src = source if isinstance(source, SourceModel) else read_source(source)
    options = resolve_sizes(src, options)
    resolve_rope_dim(src, options.rope_dim, options.stock)  # fail before the (long) calibration
    windows = calibration_windows(src, options.calib, options.calib_tokens, options.ctx)
    stats = collect_stats(src, windows)
    dtype = MODEL_DTYPES[options.dtype]
    cfg, tensors, info = build_model(src, stats, options, dtype=dtype)
    measured = measure(src, cfg, tensors, options.eval_tokens, options.ctx) if options.eval_tokens else {}
    record = {**asdict(options), "calib": options.calib or "default corpus", "calib_tokens": int(stats[0].tokens),
              "rope_theta": info["rope_theta"]}
    return export(Path(out), src, cfg, tensors, info, record, measured)
