"""`convert(source, out, options)`: read a source, calibrate, convert, measure, write the folder."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from latentkv.convert import budget, spill
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.export import export, write_card
from latentkv.convert.layerwise import converted_perplexity, source_perplexity
from latentkv.convert.options import ConvertOptions, calib_torch_dtype
from latentkv.convert.pipeline import convert_parts, resolve_rope_dim
from latentkv.convert.stock import STOCK_ROPE_DIM, stock_size
from latentkv.eval.perplexity import PROTOCOL, text_windows
from latentkv.facts import MODEL_DTYPES
from latentkv.kernels import attention as attention_kernels, decode_ops, qlinear
from latentkv.kernels.build import build_in_background
from latentkv.sizes import peak_rss
from latentkv.sources.corpus import default_documents, file_documents, heldout_text, marked_chat_windows, token_windows
from latentkv.sources.readers import read_source
from latentkv.sources.source_model import SourceModel

DEFAULTS = ConvertOptions()
# With no size option the conversion is exact (rope "all" + rank "full": nothing of the source's attention
# dropped) and the folder records DEFAULT_CACHE_DTYPE as its cache. Issue 13's rule, in served bytes
# (docs/conversion.md, "Choosing the default by behaviour"): the smallest cache on the measured frontier whose
# held-out chat agreement is >= sweep.MIN_AGREEMENT in float32 and in bf16 and whose perplexity is within
# sweep.MAX_PPL_RATIO on every domain. For SmolLM2 that is the exact conversion in int8_rope8: 11,760 B/token,
# 0.983 / 0.979; rope 96 + rank 240 took 13,080 B in int8 (0.952 / 0.948) and 10,320 in int8_rope8 (0.953 / 0.948).
# DEFAULT_ROPE_DIM is the rope dim of a size given without one (capped at a third of the cache: split_cache);
# DEFAULT_STOCK_RATIO the size of a --stock export given none, before snapping to the target's widths. (Here,
# beside `convert`: the start-up cache key hashes this module's DEFAULT_* with convert's defaults, so changing
# them makes `make serve` convert again.)
DEFAULT_CACHE_DTYPE = "int8_rope8"
DEFAULT_ROPE_DIM = 96
DEFAULT_STOCK_RATIO = 7 / 8


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
    if options.kv_bytes is not None:
        return options  # budget.choose decides the sizes from measurements, after calibration
    rope_dim, kv_rank, ratio = options.rope_dim, options.kv_rank, options.cache_ratio
    if ratio is None and kv_rank is None and rope_dim is None:
        if not options.stock:
            return replace(
                options, rope_dim="all", kv_rank="full", cache_dtype=options.cache_dtype or DEFAULT_CACHE_DTYPE
            )
        ratio = DEFAULT_STOCK_RATIO
    if options.stock and (options.target != "any" or options.stock_width is not None):
        if ratio is not None:  # the width asked for, before snapping to one the target takes
            kv_rank, ratio = round(float(ratio) * src.kv_elements()) - STOCK_ROPE_DIM, None
        rope_dim, kv_rank, notes = stock_size(src, rope_dim, kv_rank, options.target, options.stock_width)
        for note in notes:
            print(f"latentkv convert: {note}")
    if ratio is not None:
        rope_dim, kv_rank = split_cache(src, float(ratio), rope_dim)
    if rope_dim is None:
        rope_dim = min(DEFAULT_ROPE_DIM, src.num_kv_heads * src.head_dim)
    return replace(options, rope_dim=rope_dim, kv_rank="full" if kv_rank is None else kv_rank, cache_ratio=ratio)


def calibration_windows(
    src: SourceModel, calib, calib_tokens: int, ctx: int, calib_chat: float = 0.0, calib_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(windows [N, ctx], position weights [N, ctx] or None): a calib_chat share of chat
    conversations in the source's chat template (none if it has no template), the rest documents —
    the user's files or the default corpus (calibration split). The chat answers' and control
    tokens' positions weigh calib_weight, every other position 1 (calib_weight 1: None, unweighted)."""
    tokenizer = src.tokenizer()
    chat, marked = marked_chat_windows(tokenizer, round(calib_chat * calib_tokens / ctx), ctx)
    if calib_chat and not len(chat):
        print(f"latentkv convert: {src.path.name} has no chat template: calibrating on documents only")
    rest = calib_tokens - chat.numel()
    if rest >= ctx:
        docs = file_documents(calib) if calib else list(default_documents(heldout=False))
        doc_windows = token_windows(tokenizer, docs, ctx, rest, seed=0)
        chat = torch.cat([doc_windows, chat])
        marked = torch.cat([torch.zeros_like(doc_windows, dtype=torch.bool), marked])
    weights = None if calib_weight == 1 else torch.where(marked, float(calib_weight), 1.0)
    return chat, weights


def calibrate(
    src: SourceModel, windows: torch.Tensor, dtype: torch.dtype, scratch: Path, weights: torch.Tensor | None = None
) -> list:
    """collect_stats, with the calibration activations and the statistics in files under scratch
    when they pass spill.BUDGET (the same numbers, in bounded memory)."""
    D = src.hidden_size
    return collect_stats(
        src,
        windows,
        dtype=dtype,
        store=spill.batch_store(scratch, windows.numel() * D * 4),
        keep=spill.stats_keeper(scratch, src.num_layers * (D + 1) ** 2 * 8),
        weights=weights,
    )


def measure(src: SourceModel, folder: Path, eval_tokens: int, ctx: int) -> dict:
    """Held-out perplexities of the source and the converted folder, with the protocol, windows and
    model of `latentkv eval ppl` (latentkv's model in float32), each run one layer's weights at a
    time (layerwise.py: the same numbers as the whole models, in the memory of one layer)."""
    windows = text_windows(src.tokenizer(), heldout_text(), ctx, eval_tokens)
    source = source_perplexity(src, windows)
    converted = converted_perplexity(folder, windows)
    return {
        "source ppl": source["ppl"],
        "converted ppl": converted["ppl"],
        "ratio": converted["ppl"] / source["ppl"],
        "protocol": PROTOCOL.format(ctx=ctx) + f", {source['tokens']} tokens of the default held-out text",
    }


def step(n: int, text: str, started: float) -> None:
    """One line per stage (with the time and peak RSS so far) on stderr, as the bars: a caller's stdout
    (`latentkv serve` converting on first use, a script reading the folder's path) carries only results.
    The long stages then show their own bar with the time left."""
    so_far = f"{time.perf_counter() - started:.0f} s, peak RSS {peak_rss() / 2**30:.2f} GiB so far"
    tqdm.write(f"latentkv convert [{n}/5] {text} ({so_far})", file=sys.stderr)


def convert(source=None, out="converted", options: ConvertOptions = DEFAULTS, stats=None) -> Path:
    """Convert a Llama-family model (GGUF or HF folder; None: bundled SmolLM2) to MLA in `out`;
    stats: calibration statistics already collected with these options' calibration (several
    conversions of one source share them: `bench frontier`)."""
    options.check()
    started = time.perf_counter()
    if options.eval_tokens:  # the check runs latentkv's model: its first build (FIRST_BUILD each) overlaps calibration
        # (qlinear: the int4/int8 linears, and the float32 ones of batch-invariant serving)
        build_in_background(attention_kernels.EXT, decode_ops.EXT, qlinear.EXT)
    step(1, f"reading {source if source is not None else 'the bundled SmolLM2'}", started)
    src = source if isinstance(source, SourceModel) else read_source(source)
    options = resolve_sizes(src, options)
    if options.kv_bytes is None:
        resolve_rope_dim(src, options.rope_dim, options.stock)  # fail before the (long) calibration
    else:
        budget.check(src, options.kv_bytes)
    step(2, f"tokenizing calibration text ({options.calib_chat:.0%} chat conversations)", started)
    windows, weights = calibration_windows(
        src, options.calib, options.calib_tokens, options.ctx, options.calib_chat, options.calib_weight
    )
    calib_dtype = calib_torch_dtype(options.calib_dtype)
    step(
        3, f"calibrating {src.num_layers} layers on {windows.numel()} tokens ({str(calib_dtype)[6:]} matmuls)", started
    )
    Path(out).resolve().parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".latentkv-scratch-", dir=Path(out).resolve().parent) as scratch:
        stats = stats or calibrate(src, windows, calib_dtype, Path(scratch), weights)
        measured_caches = []
        if options.kv_bytes is not None:
            options, measured_caches = budget.choose(src, stats, options, windows)
        dtype = MODEL_DTYPES[options.dtype]
        cfg, info, parts = convert_parts(src, stats, options, dtype=dtype, windows=windows)
        if options.cache_dtype or options.cache_format:
            if options.cache_format:
                cfg["latentkv"]["cache_format"] = options.cache_format  # bits per direction: transform_code.py
            else:
                cfg["latentkv"]["cache_dtype"] = options.cache_dtype
            if options.kv_bytes is not None:
                cfg["latentkv"]["kv_bytes"] = options.kv_bytes  # the budget it was chosen within
            budget.check_written(cfg, options)
        record = {
            **{k: v for k, v in asdict(options).items() if k != "cache_format"},  # config.json holds it
            "calib": options.calib or "default corpus",
            "calib_tokens": int(stats[0].tokens),
            "rope_theta": info["rope_theta"],
        }
        if measured_caches:
            record["kv_bytes_candidates"] = [{**asdict(c), "code": None} for c in measured_caches]
        refined = f", refining each layer {options.refine_steps} steps" if options.refine_steps else ""
        step(
            4,
            f"converting (rope dim {info['rope_dim']}, latent rank {max(info['ranks'])}{refined}) and writing {out}",
            started,
        )
        out = export(
            Path(out),
            src,
            cfg,
            tqdm(parts, desc="converting and writing layers", unit="part", total=src.num_layers + 1),
            info,
            record,
        )
    if options.eval_tokens:
        step(5, f"measuring perplexity on {options.eval_tokens} held-out tokens (source and converted)", started)
    measured = measure(src, out, options.eval_tokens, options.ctx) if options.eval_tokens else {}
    write_card(out, src, cfg, info, record, measured)
    print(f"latentkv convert: {time.perf_counter() - started:.1f} s, peak RSS {peak_rss() / 2**30:.2f} GiB")
    return out
