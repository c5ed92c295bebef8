"""`convert(...)`: read a source, calibrate, convert, measure, write the folder."""
from __future__ import annotations

from pathlib import Path

import torch

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.corpus import default_documents, file_documents, token_windows
from latentkv.convert.export import export
from latentkv.convert.pipeline import Settings, build_model, resolve_rope_dim
from latentkv.convert.sources import SourceModel, read_source
from latentkv.facts import MODEL_DTYPES

DEFAULT_CALIB_TOKENS = 32768
DEFAULT_CTX = 512
DEFAULT_EVAL_TOKENS = 4096
# With no size option: the smallest cache (int8 latent bytes counted) measured within +5%
# perplexity of the original SmolLM2 in docs/conversion.md.
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


def resolve_settings(src, rope_dim, kv_rank, cache_ratio, stock, **extra) -> Settings:
    """Settings from the user's size options (none: the measured default)."""
    if cache_ratio is not None and kv_rank is not None:
        raise ValueError("give --cache-ratio or --kv-rank, not both")
    if cache_ratio is None and kv_rank is None and rope_dim is None:
        cache_ratio = DEFAULT_CACHE_RATIO
    if cache_ratio is not None:
        rope_dim, kv_rank = split_cache(src, float(cache_ratio), rope_dim)
    if rope_dim is None:
        rope_dim = min(DEFAULT_ROPE_DIM, src.num_kv_heads * src.head_dim)
    if kv_rank is None:
        kv_rank = "full"
    return Settings(rope_dim=rope_dim, kv_rank=kv_rank, stock=stock, **extra)


def calibration_windows(src: SourceModel, calib, calib_tokens: int, ctx: int) -> torch.Tensor:
    """[N, ctx] calibration windows from user files or the default corpus (calibration split)."""
    docs = file_documents(calib) if calib else list(default_documents(heldout=False))
    return token_windows(src.tokenizer(), docs, ctx, calib_tokens, seed=0)


def measure(src: SourceModel, cfg: dict, tensors: dict, eval_tokens: int, ctx: int) -> dict:
    """Held-out perplexities of the source and the converted model (in memory)."""
    from latentkv.convert.mla_reference import mla_logits
    from latentkv.convert.reference import source_logits
    from latentkv.eval.ppl import PROTOCOL, perplexity

    windows = token_windows(src.tokenizer(), list(default_documents(heldout=True)), ctx, eval_tokens, seed=1)
    tensors32 = {k: v.float() for k, v in tensors.items()}
    source = perplexity(lambda ids: source_logits(src, ids), windows, desc="perplexity (source)")
    converted = perplexity(lambda ids: mla_logits(cfg, tensors32, ids), windows, desc="perplexity (converted)")
    return {"source ppl": source["ppl"], "converted ppl": converted["ppl"],
            "ratio": converted["ppl"] / source["ppl"],
            "protocol": PROTOCOL.format(ctx=ctx) + f", {source['tokens']} tokens of the default held-out text"}


def convert(source=None, out="converted", rope_dim=None, kv_rank=None, cache_ratio=None, calib=None,
            calib_tokens: int = DEFAULT_CALIB_TOKENS, stock: bool = False, dtype: str = "float32",
            ctx: int = DEFAULT_CTX, eval_tokens: int = DEFAULT_EVAL_TOKENS, weighting: str = "attention",
            rank_alloc: str = "uniform", rope_theta: float | None = None, sequential: bool = False,
            k_weight: float = 5.0) -> Path:
    """Convert a Llama-family model (GGUF or HF folder; None: bundled SmolLM2) to MLA in `out`.

    rope_dim: even int or "all"; kv_rank: int (mean latent width) or "full"; cache_ratio:
    cache elements as a fraction of the source's (sets both); eval_tokens=0 skips measuring.
    """
    if dtype not in MODEL_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(MODEL_DTYPES)}")
    src = source if isinstance(source, SourceModel) else read_source(source)
    if stock and dtype == "float16":
        raise ValueError("export --stock as float32 or bfloat16: its latent (~1e-4) is below float16's normal range")
    if stock and src.qkv_bias:
        raise ValueError("the stock deepseek_v3 format has no q_proj bias; convert this source without --stock")
    settings = resolve_settings(src, rope_dim, kv_rank, cache_ratio, stock, weighting=weighting,
                                rank_alloc=rank_alloc, rope_theta=rope_theta, sequential=sequential, k_weight=k_weight)
    resolve_rope_dim(src, settings.rope_dim, stock)  # fail before the (long) calibration
    windows = calibration_windows(src, calib, calib_tokens, ctx)
    stats = collect_stats(src, windows)
    if sequential:
        from latentkv.convert.sequential import build_sequential

        cfg, tensors, info = build_sequential(src, stats, windows, settings, dtype=MODEL_DTYPES[dtype])
    else:
        cfg, tensors, info = build_model(src, stats, settings, dtype=MODEL_DTYPES[dtype], sensitivity_ids=windows[:2])
    measured = measure(src, cfg, tensors, eval_tokens, ctx) if eval_tokens else {}
    record = {"rope_dim": settings.rope_dim, "kv_rank": settings.kv_rank, "cache_ratio": cache_ratio,
              "stock": stock, "weighting": weighting, "k_weight": k_weight, "rank_alloc": rank_alloc,
              "sequential": sequential, "calib": calib or "default corpus",
              "calib_tokens": int(stats[0].tokens), "ctx": ctx, "rope_theta": info["rope_theta"], "dtype": dtype}
    return export(Path(out), src, cfg, tensors, info, record, measured)
