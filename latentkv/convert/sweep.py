"""`latentkv convert-sweep`: KV bytes per token against perplexity, native and stock.

One run: calibrate the source once, then for each rope dim and latent rank build the
converted model in memory (native and stock), score the held-out windows with the same
protocol as `latentkv eval ppl`, and with an int8 latent (per-token scale max|c|/127,
as the paged cache stores it). Writes a markdown table, JSON and a PNG plot.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from latentkv.cache.accounting import latent_bytes
from latentkv.convert.api import calibration_windows
from latentkv.convert.calibrate import collect_stats, load_stats, save_stats
from latentkv.convert.corpus import heldout_text
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, plan_rope
from latentkv.convert.reference import source_logits
from latentkv.convert.sources import read_source
from latentkv.eval.perplexity import PROTOCOL, perplexity, text_windows


def cache_bytes(ranks: list[int], rope_dim: int, int8: bool) -> int:
    """KV bytes per token over all layers: bf16 latent + rope, or int8 latent + scale + bf16 rope."""
    return latent_bytes(ranks, rope_dim, "int8" if int8 else "auto", "bfloat16")


def default_ranks(src, rope_dim: int) -> list:
    """Six-plus latent widths from full down to a third of the source's cache."""
    full = 2 * src.num_kv_heads * src.head_dim
    sizes = [1.0, 0.833, 0.667, 0.583, 0.5, 0.417, 0.333]
    return ["full"] + [round(s * full) - rope_dim for s in sizes[1:] if round(s * full) - rope_dim > 0]


def sweep_points(src, stats, windows, rope_dims, formats, ranks_for, int8_formats, log):
    """Measure every (rope dim, format, rank) point; yields row dicts."""
    for rope_dim in rope_dims:
        for fmt in formats:
            settings = ConvertOptions(rope_dim=rope_dim, stock=fmt == "stock")
            try:
                plans_info = plan_rope(src, stats, settings)
            except ValueError as err:
                log(f"skip rope {rope_dim} {fmt}: {err}")
                continue
            for rank in ranks_for(rope_dim):
                cfg, tensors, info = build_model(src, stats, replace(settings, kv_rank=rank), plans_info)
                row = {"rope_dim": info["rope_dim"], "format": fmt, "kv_rank": max(info["ranks"]),
                       "elements": sum(info["ranks"]) / len(info["ranks"]) + info["rope_dim"],
                       "bytes_bf16": cache_bytes(info["ranks"], info["rope_dim"], False),
                       "bytes_int8": cache_bytes(info["ranks"], info["rope_dim"], True),
                       "rope_theta": info["rope_theta"]}
                model = converted_model(cfg, tensors)
                row["ppl"] = perplexity(model.full_logits, windows)["ppl"]
                if fmt in int8_formats:
                    row["ppl_int8"] = perplexity(lambda ids: model.full_logits(ids, cache_dtype="int8"), windows)["ppl"]
                log(json.dumps(row))
                yield row


def markdown_table(rows: list[dict], base: float, src_bytes: int) -> str:
    """The sweep as a markdown table (ratios to the source's perplexity)."""
    head = ("| rope dim | format | latent rank | elements / layer | cache vs source | bytes/token bf16 | ppl (bf16) "
            "| ratio | bytes/token int8 | ppl (int8) | ratio int8 |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        int8 = (f"{r['bytes_int8']} | {r['ppl_int8']:.3f} | {r['ppl_int8'] / base:.3f}" if "ppl_int8" in r else "– | – | –")
        lines.append(f"| {r['rope_dim']} | {r['format']} | {r['kv_rank']} | {r['elements']:.0f} | "
                     f"{r['bytes_bf16'] / src_bytes:.3f} | {r['bytes_bf16']} | {r['ppl']:.3f} | {r['ppl'] / base:.3f} | {int8} |")
    return "\n".join(lines)


def plot(rows: list[dict], base: float, src_bytes: int, path: Path) -> None:
    """PNG: perplexity ratio against KV bytes per token, one line per rope dim / format / latent dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    keys = sorted({(r["rope_dim"], r["format"]) for r in rows}, key=lambda k: (-k[0], k[1]))
    for rope_dim, fmt in keys:
        pts = sorted((r for r in rows if (r["rope_dim"], r["format"]) == (rope_dim, fmt)), key=lambda r: r["bytes_bf16"])
        style = "-" if fmt == "native" else "--"
        line, = ax.plot([r["bytes_bf16"] for r in pts], [r["ppl"] / base for r in pts], style, marker="o",
                        label=f"rope {rope_dim}, {fmt}, bf16 latent")
        int8 = [r for r in pts if "ppl_int8" in r]
        if int8:
            ax.plot([r["bytes_int8"] for r in int8], [r["ppl_int8"] / base for r in int8], ":", marker="x",
                    color=line.get_color(), label=f"rope {rope_dim}, {fmt}, int8 latent")
    ax.axvline(src_bytes, color="gray", lw=0.8)
    ax.text(src_bytes, ax.get_ylim()[1], " source GQA (bf16)", va="top", fontsize=8, color="gray")
    for target, label in [(1.08, "+8%"), (1.20, "+20%"), (1.05, "+5%")]:
        ax.axhline(target, color="gray", ls=":", lw=0.8)
        ax.text(ax.get_xlim()[0], target, f" {label}", va="bottom", fontsize=8, color="gray")
    ax.set_xlabel("KV cache bytes per token (all layers)")
    ax.set_ylabel("perplexity / original perplexity")
    ax.set_title("SmolLM2-135M → MLA, training-free (held-out text, 512-token windows)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_sweep(source=None, out_dir="sweep", rope_dims=(64, 32), formats=("native", "stock"), ranks=None,
              calib_tokens=16384, eval_tokens=4096, ctx=512, int8_formats=("native", "stock"), log=print,
              stats_cache=None) -> dict:
    """Run the sweep; writes sweep.md, sweep.json, sweep.png into out_dir and returns the JSON dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    src = read_source(source)
    if stats_cache and Path(stats_cache).is_file():
        stats = load_stats(stats_cache)
        log(f"calibration statistics from {stats_cache} ({stats[0].tokens} tokens)")
    else:
        stats = collect_stats(src, calibration_windows(src, None, calib_tokens, ctx))
        if stats_cache:
            save_stats(stats, stats_cache)
    windows = text_windows(src.tokenizer(), heldout_text(), ctx, eval_tokens)
    base = perplexity(lambda ids: source_logits(src, ids), windows)["ppl"]
    log(f"source perplexity {base:.4f}")
    src_bytes = 2 * src.kv_elements() * src.num_layers
    ranks_for = (lambda dr: list(ranks)) if ranks else (lambda dr: default_ranks(src, dr))
    rows = []
    for row in sweep_points(src, stats, windows, rope_dims, formats, ranks_for, int8_formats, log):
        rows.append(row)  # rewrite the outputs after every point so a cut-short run keeps what it measured
        result = {"source": str(src.path), "source_ppl": base, "source_bytes_bf16": src_bytes, "ctx": ctx,
                  "eval_tokens": int(windows[:, 1:].numel()), "calib_tokens": int(stats[0].tokens),
                  "protocol": PROTOCOL.format(ctx=ctx), "rows": rows, "seconds": round(time.time() - start)}
        (out_dir / "sweep.json").write_text(json.dumps(result, indent=2) + "\n")
        (out_dir / "sweep.md").write_text(markdown_table(rows, base, src_bytes) + "\n")
        plot(rows, base, src_bytes, out_dir / "sweep.png")
    log(markdown_table(rows, base, src_bytes))
    return result


def register(subparsers) -> None:
    """Add `convert-sweep` (bench/ has its own command module, so the sweep lives here)."""
    p = subparsers.add_parser("convert-sweep", help="KV bytes per token vs perplexity of converted models (table + PNG)")
    p.add_argument("source", nargs="?", default=None, help="source model (default: bundled SmolLM2)")
    p.add_argument("--out", default="sweep", help="folder for sweep.md, sweep.json, sweep.png")
    p.add_argument("--rope-dims", type=int, nargs="+", default=[64, 32])
    p.add_argument("--ranks", type=int, nargs="+", default=None, help="latent ranks (default: full and six smaller)")
    p.add_argument("--formats", nargs="+", default=["native", "stock"], choices=["native", "stock"])
    p.add_argument("--calib-tokens", type=int, default=16384)
    p.add_argument("--eval-tokens", type=int, default=4096)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--int8-formats", nargs="*", default=["native", "stock"], choices=["native", "stock"],
                   help="formats also measured with an int8 latent")
    p.add_argument("--stats-cache", default=None, help="safetensors file: reuse calibration statistics (written if absent)")
    p.set_defaults(func=lambda args: run_cli(args))


def run_cli(args: argparse.Namespace) -> int:
    run_sweep(args.source, args.out, args.rope_dims, args.formats, args.ranks, args.calib_tokens, args.eval_tokens,
              args.ctx, int8_formats=args.int8_formats, stats_cache=args.stats_cache)
    return 0
