"""`ConvertOptions`: everything a conversion can be told, with the measured defaults."""
from __future__ import annotations

from dataclasses import dataclass, replace

from latentkv.convert.source_model import SourceModel
from latentkv.model.loader import DTYPES  # the model dtypes: what a converted folder can be stored in

# With no size option: the smallest cache (int8 latent bytes counted) measured within +5%
# perplexity of the original SmolLM2 in docs/conversion.md.
DEFAULT_ROPE_DIM = 64
DEFAULT_CACHE_RATIO = 5 / 6  # rope 64 + rank 256 = 320 of 384 elements: +4.6% (int8 latent +4.6%)


@dataclass(frozen=True)
class ConvertOptions:
    """Sizes — rope_dim: even int or "all"; kv_rank: int (mean latent width), "full" or a
    per-layer list; cache_ratio: cache elements as a fraction of the source's (sets both);
    none of the three: DEFAULT_CACHE_RATIO.
    Data — calib: text files (None: the default corpus); calib_tokens; ctx (window length
    for calibration and evaluation); eval_tokens (held-out tokens to measure, 0: skip).
    Output — stock: plain deepseek_v3 (loads in unmodified transformers / vLLM);
    dtype; rope_theta: the stock schedule (None: chosen).
    Method — weighting: "attention" (errors in attention-output units), "aware" or
    "balanced"; k_weight: extra weight of key against value error (5 measured best: the
    first-order model underrates score errors); rank_alloc: "uniform", "spectrum" or
    "measured"; sequential: refit each latent on the converted model's activations
    (docs/conversion.md: the alternatives to the defaults measured worse)."""

    rope_dim: int | str | None = None
    kv_rank: int | str | list | None = None
    cache_ratio: float | None = None
    calib: list | None = None
    calib_tokens: int = 32768
    ctx: int = 512
    eval_tokens: int = 4096
    stock: bool = False
    dtype: str = "float32"
    rope_theta: float | None = None
    weighting: str = "attention"
    k_weight: float = 5.0
    rank_alloc: str = "uniform"
    sequential: bool = False

    def check(self) -> None:
        """Errors that need no source."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        if self.stock and self.dtype == "float16":
            raise ValueError("export --stock as float32 or bfloat16: its latent (~1e-4) is below float16's normal range")
        if self.cache_ratio is not None and self.kv_rank is not None:
            raise ValueError("give --cache-ratio or --kv-rank, not both")


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
    """The options with rope_dim and kv_rank decided (none given: the measured default)."""
    options.check()
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
