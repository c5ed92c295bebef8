"""`latentkv convert-sweep`: KV bytes per token against behaviour and perplexity, native and stock.

One run: calibrate the source once (the default mix of documents and chat), then for each rope
dim and latent rank build the converted model in memory (native and stock) and measure it
against the source: `eval chat` on the held-out chat prompts (top-1 agreement, KL, greedy match
length, degenerate repetition), perplexity on every domain of `eval ppl --domains` (docs,
prose, code) with the same protocol, and docs perplexity with an int8 latent (per-token scale
max|c|/127, as the paged cache stores it). Picks the default the way the converter's default
was chosen (`pick_default`). Writes a markdown table, JSON and a PNG plot.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from latentkv.cache.accounting import latent_bytes
from latentkv.convert.api import calibration_windows
from latentkv.convert.calibrate import collect_stats, load_stats, save_stats
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions, calib_torch_dtype
from latentkv.convert.pipeline import build_model, plan_rope
from latentkv.eval.chat import ChatModel, chat_metrics, render_cases
from latentkv.eval.domains import DOMAINS
from latentkv.eval.perplexity import PROTOCOL, perplexity, text_windows
from latentkv.sources.chat_data import load_chat
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

DEFAULTS = ConvertOptions()
# The default conversion: the smallest cache meeting both, in float32 and bf16 (issue 13; docs/conversion.md).
MIN_AGREEMENT = 0.95  # held-out chat top-1 agreement with the source
MAX_PPL_RATIO = 1.05  # perplexity / the source's, on every domain
SIZES = [1.0, 0.833, 0.75, 0.667, 0.5, 0.25]  # cache elements as a fraction of the source's


def cache_bytes(ranks: list[int], rope_dim: int, int8: bool) -> int:
    """KV bytes per token over all layers: bf16 latent + rope, or int8 latent + scale + bf16 rope."""
    return latent_bytes(ranks, rope_dim, "int8" if int8 else "auto", "bfloat16")


def ranks_at(src, rope_dim: int, sizes) -> list:
    """Latent widths that make caches of `sizes` (fractions of the source's elements) at rope_dim
    (an int: "all" already resolved); a size 1.0 or more is "full", sizes with no room are left out."""
    full = src.kv_elements()
    ranks = []
    for s in sizes:
        rank = "full" if s >= 1 else round(s * full) - rope_dim
        if rank == "full" or rank > 0:
            ranks.append(rank)
    return ranks


class Judge:
    """The measurements every point gets, against the source: held-out chat behaviour and
    perplexity per domain (source figures computed once)."""

    def __init__(self, src, eval_tokens: int, ctx: int, chat_examples: int | None, out_dir: Path, log):
        tokenizer = src.tokenizer()
        self.tokenizer, self.folder = tokenizer, str(out_dir)
        self.reference = ChatModel(
            lambda ids: source_logits(src, ids), tokenizer, "source", str(src.path), memoize=True
        )
        self.cases = (
            render_cases(tokenizer, load_chat(src.path, "heldout")[:chat_examples]) if chat_examples != 0 else []
        )
        self.windows = {d: text_windows(tokenizer, text(), ctx, eval_tokens) for d, text in DOMAINS.items()}
        self.base = {
            d: perplexity(self.reference.logits, w, desc=f"source ppl {d}")["ppl"] for d, w in self.windows.items()
        }
        log(f"source perplexity {json.dumps(self.base)}")

    def measure(self, model, int8: bool) -> dict:
        row = {f"ppl_{d}": perplexity(model.full_logits, w, desc=f"ppl {d}")["ppl"] for d, w in self.windows.items()}
        row["ppl"] = row["ppl_docs"]
        row["ppl_ratio_max"] = max(row[f"ppl_{d}"] / self.base[d] for d in self.windows)
        if int8:
            row["ppl_int8"] = perplexity(lambda ids: model.full_logits(ids, cache_dtype="int8"), self.windows["docs"])[
                "ppl"
            ]
        if self.cases:
            chat = chat_metrics(ChatModel.from_mla(model, self.tokenizer, self.folder), self.reference, self.cases)
            row.update(
                {
                    k: chat[k]
                    for k in (
                        "top1_agreement",
                        "kl",
                        "match_mean",
                        "full_match",
                        "degenerate",
                        "degenerate_reference",
                        "examples",
                    )
                }
            )
            row["degenerate_ids"] = [p["id"] for p in chat["per_example"] if p.get("degenerate")]
            row["answers"] = {p["id"]: p["greedy_text"] for p in chat["per_example"] if "greedy_text" in p}
        return row


def sweep_points(
    src,
    stats,
    judge: Judge,
    rope_dims,
    formats,
    ranks_for,
    int8_formats,
    log,
    rope_window=DEFAULTS.rope_window,
    refine_steps=(0,),
    refine_lr=DEFAULTS.refine_lr,
    windows=None,
):
    """Measure every (rope dim, format, rank, refine steps) point; yields row dicts. windows: the
    calibration windows (refinement fits on them)."""
    for rope_dim in rope_dims:
        for fmt in formats:
            settings = ConvertOptions(rope_dim=rope_dim, stock=fmt == "stock", rope_window=rope_window)
            try:
                plans_info = plan_rope(src, stats, settings)
            except ValueError as err:
                log(f"skip rope {rope_dim} {fmt}: {err}")
                continue
            points = [(rank, n) for rank in ranks_for(plans_info[1]) for n in refine_steps]  # rope dim resolved
            for rank, n in points:
                started = time.time()
                cfg, tensors, info = build_model(
                    src,
                    stats,
                    replace(settings, kv_rank=rank, refine_steps=n, refine_lr=refine_lr),
                    plans_info,
                    windows=windows,
                )
                row = {
                    "rope_dim": info["rope_dim"],
                    "format": fmt,
                    "kv_rank": max(info["ranks"]),
                    "refine_steps": n,
                    "build_seconds": round(time.time() - started),
                    "elements": sum(info["ranks"]) / len(info["ranks"]) + info["rope_dim"],
                    "bytes_bf16": cache_bytes(info["ranks"], info["rope_dim"], False),
                    "bytes_int8": cache_bytes(info["ranks"], info["rope_dim"], True),
                    "rope_theta": info["rope_theta"],
                }
                row["cache_ratio"] = row["elements"] / src.kv_elements()
                row.update(judge.measure(converted_model(cfg, tensors), fmt in int8_formats))
                log(json.dumps(row))
                yield row


def meets(row: dict) -> bool:
    """Whether a point meets the default's bar (MIN_AGREEMENT and MAX_PPL_RATIO on every domain)."""
    return row.get("top1_agreement", 0) >= MIN_AGREEMENT and row["ppl_ratio_max"] <= MAX_PPL_RATIO


def pick_default(rows: list[dict]) -> dict | None:
    """The smallest native cache (bf16 bytes per token) that meets the bar, or None."""
    good = [r for r in rows if r["format"] == "native" and meets(r)]
    return min(good, key=lambda r: r["bytes_bf16"]) if good else None


def pick_served_default(rows: list[dict], original_ppl: dict) -> dict | None:
    """The smallest served cache of a `bench frontier` table (its latentkv rows: bytes_per_token,
    agreement_float32 / _bfloat16, ppl per domain) that meets the bar in float32 and in bf16, or None."""

    def ok(row: dict) -> bool:
        agreement = min(row.get("agreement_float32", 0), row.get("agreement_bfloat16", 0))
        return (
            agreement >= MIN_AGREEMENT
            and max(row[f"ppl_{d}"] / ppl for d, ppl in original_ppl.items()) <= MAX_PPL_RATIO
        )

    good = [r for r in rows if r["system"].startswith("latentkv") and ok(r)]
    return min(good, key=lambda r: r["bytes_per_token"]) if good else None


def markdown_table(rows: list[dict], base: dict, src_bytes: int) -> str:
    """The sweep as a markdown table: behaviour against the source and perplexity ratios per domain.
    A point at or below half the source's cache whose greedy answers degenerate is flagged."""
    domains = list(base)
    head = (
        "| rope | format | latent rank | cache vs source | bytes/token bf16 | chat top-1 | KL | match mean "
        "| degenerate | " + " | ".join(f"ppl {d} ×" for d in domains) + " | int8 docs × | meets bar |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |" + " ---: |" * len(domains) + " ---: | --- |"
    )
    lines = [head]
    for r in rows:
        chat = "– | – | – | –"
        if "top1_agreement" in r:
            degenerate = f"{r['degenerate']} of {r['examples']}"
            if r["degenerate"] and r["cache_ratio"] <= 0.5 + 1e-9:
                degenerate = f"**{degenerate}: degenerate repetition**"
            chat = f"{r['top1_agreement']:.4f} | {r['kl']:.4f} | {r['match_mean']:.1f} | {degenerate}"
        ratios = " | ".join(f"{r[f'ppl_{d}'] / base[d]:.3f}" for d in domains)
        int8 = f"{r['ppl_int8'] / base['docs']:.3f}" if "ppl_int8" in r else "–"
        fmt = r["format"] + (f", refined {r['refine_steps']}" if r.get("refine_steps") else "")
        lines.append(
            f"| {r['rope_dim']} | {fmt} | {r['kv_rank']} | {r['bytes_bf16'] / src_bytes:.3f} | "
            f"{r['bytes_bf16']} | {chat} | {ratios} | {int8} | {'yes' if meets(r) else 'no'} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], base: dict, src_bytes: int, path: Path) -> None:
    """PNG: chat top-1 agreement and the worst domain's perplexity ratio against KV bytes per token,
    one line per rope dim / format."""
    import matplotlib  # optional heavy import, only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    keys = sorted({(r["rope_dim"], r["format"]) for r in rows}, key=lambda k: (-k[0], k[1]))
    for rope_dim, fmt in keys:
        pts = sorted(
            (r for r in rows if (r["rope_dim"], r["format"]) == (rope_dim, fmt)), key=lambda r: r["bytes_bf16"]
        )
        style = "-" if fmt == "native" else "--"
        x = [r["bytes_bf16"] for r in pts]
        if all("top1_agreement" in r for r in pts):
            top.plot(x, [r["top1_agreement"] for r in pts], style, marker="o", label=f"rope {rope_dim}, {fmt}")
            flagged = [r for r in pts if r["degenerate"]]
            top.plot([r["bytes_bf16"] for r in flagged], [r["top1_agreement"] for r in flagged], "rx", ms=10)
        bottom.plot(x, [r["ppl_ratio_max"] for r in pts], style, marker="o", label=f"rope {rope_dim}, {fmt}")
    top.axhline(MIN_AGREEMENT, color="gray", ls=":", lw=0.8)
    top.set_ylabel("held-out chat top-1 agreement\n(red x: degenerate answers)")
    bottom.axhline(MAX_PPL_RATIO, color="gray", ls=":", lw=0.8)
    bottom.set_ylabel("worst domain perplexity / source\n(" + ", ".join(base) + ")")
    for ax in (top, bottom):
        ax.axvline(src_bytes, color="gray", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    bottom.set_xlabel("KV cache bytes per token (all layers, bf16)")
    top.set_title("SmolLM2-135M → MLA, training-free: behaviour and perplexity against the original")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_sweep(
    source=None,
    out_dir="sweep",
    rope_dims=(64, 32),
    formats=("native", "stock"),
    ranks=None,
    calib_tokens=DEFAULTS.calib_tokens,
    eval_tokens=4096,
    ctx=512,
    int8_formats=("native", "stock"),
    log=print,
    stats_cache=None,
    calib_chat=DEFAULTS.calib_chat,
    chat_examples=None,
    sizes=None,
    calib_weight=DEFAULTS.calib_weight,
    rope_window=DEFAULTS.rope_window,
    refine_steps=(0,),
    refine_lr=DEFAULTS.refine_lr,
) -> dict:
    """Run the sweep; writes sweep.md, sweep.json, sweep.png into out_dir and returns the JSON dict.
    rope_dims: even ints or "all"; ranks: latent widths for every rope dim, or sizes: cache sizes
    (fractions of the source's elements) whose rank each rope dim gets (neither: SIZES).
    chat_examples: held-out chat prompts to judge on (None: all; 0: no chat columns);
    rope_window: ConvertOptions.rope_window of every native point; refine_steps: each point is
    measured at each of these ConvertOptions.refine_steps, with refine_lr."""
    if ranks and sizes:
        raise ValueError("give ranks or sizes, not both")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    src = read_source(source)
    cached = bool(stats_cache) and Path(stats_cache).is_file()
    # the windows: for the statistics, and for refinement (which fits on them) — not otherwise read
    windows, weights = (
        calibration_windows(src, None, calib_tokens, ctx, calib_chat, calib_weight)
        if not cached or any(refine_steps)
        else (None, None)
    )
    if cached:
        stats = load_stats(stats_cache)
        log(f"calibration statistics from {stats_cache} ({stats[0].tokens} tokens)")
    else:
        stats = collect_stats(src, windows, dtype=calib_torch_dtype(DEFAULTS.calib_dtype), weights=weights)
        if stats_cache:
            save_stats(stats, stats_cache)
    judge = Judge(src, eval_tokens, ctx, chat_examples, out_dir, log)
    src_bytes = 2 * src.kv_elements() * src.num_layers
    ranks_for = (lambda dr: list(ranks)) if ranks else (lambda dr: ranks_at(src, dr, sizes or SIZES))
    meta = {
        "source": str(src.path),
        "source_ppl": judge.base,
        "source_bytes_bf16": src_bytes,
        "ctx": ctx,
        "eval_tokens": {d: int(w[:, 1:].numel()) for d, w in judge.windows.items()},
        "chat_examples": len(judge.cases),
        "calib_tokens": int(stats[0].tokens),
        "calib_chat": calib_chat,
        "calib_weight": calib_weight,
        "rope_window": rope_window,
        "k_weight": DEFAULTS.k_weight,
        "refine_lr": refine_lr,
        "protocol": PROTOCOL.format(ctx=ctx),
    }
    rows = []
    for row in sweep_points(
        src,
        stats,
        judge,
        rope_dims,
        formats,
        ranks_for,
        int8_formats,
        log,
        rope_window,
        refine_steps,
        refine_lr,
        windows,
    ):
        rows.append(row)  # rewrite the outputs after every point so a cut-short run keeps what it measured
        result = write_outputs(out_dir, meta, rows, seconds=round(time.time() - start))
    log(markdown_table(rows, judge.base, src_bytes))
    log(
        f"default by the bar (chat top-1 >= {MIN_AGREEMENT}, every domain ppl <= x{MAX_PPL_RATIO}): "
        f"{result['default'] or 'no point meets it'}"
    )
    return result


def write_outputs(out_dir: Path, meta: dict, rows: list[dict], **extra) -> dict:
    """Write out_dir/sweep.json (meta, the bar, pick_default's choice, rows), sweep.md and sweep.png."""
    chosen = pick_default(rows)
    result = {
        **meta,
        "bar": {"min_agreement": MIN_AGREEMENT, "max_ppl_ratio": MAX_PPL_RATIO},
        "default": chosen and {k: chosen[k] for k in ("rope_dim", "kv_rank", "cache_ratio", "bytes_bf16")},
        "rows": rows,
        **extra,
    }
    (out_dir / "sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "sweep.md").write_text(markdown_table(rows, meta["source_ppl"], meta["source_bytes_bf16"]) + "\n")
    plot(rows, meta["source_ppl"], meta["source_bytes_bf16"], out_dir / "sweep.png")
    return result


# What runs must share for their rows to go in one table (the source is named by its perplexities:
# the same file may sit at another path).
SAME_PROTOCOL = (
    "source_ppl",
    "source_bytes_bf16",
    "ctx",
    "eval_tokens",
    "chat_examples",
    "calib_tokens",
    "calib_chat",
    "calib_weight",
    "rope_window",
    "k_weight",
    "protocol",
)
UNRECORDED = {
    "calib_weight": 1.0,
    "rope_window": None,
    "k_weight": 5.0,
}  # what a run that predates a field measured with


def merge_sweeps(parts, out_dir) -> dict:
    """One table from several sweep runs' sweep.json (e.g. rope dims or sizes run as separate
    invocations on the same statistics): rows by size, largest first; outputs as run_sweep's."""
    runs = [(str(p), json.loads(Path(p, "sweep.json").read_text())) for p in parts]
    first = runs[0][1]
    for name, run in runs[1:]:
        differ = [k for k in SAME_PROTOCOL if run.get(k, UNRECORDED.get(k)) != first.get(k, UNRECORDED.get(k))]
        if differ:
            raise ValueError(
                f"{name}/sweep.json differs from {runs[0][0]}/sweep.json in {', '.join(differ)}: "
                f"its rows do not compare"
            )
    rows = sorted(
        (r for _, run in runs for r in run["rows"]), key=lambda r: (-r["cache_ratio"], r["rope_dim"], r["format"])
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"source": first["source"], **{k: first.get(k, UNRECORDED.get(k)) for k in SAME_PROTOCOL}}
    return write_outputs(out_dir, meta, rows, merged_from=[name for name, _ in runs])
