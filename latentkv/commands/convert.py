"""`latentkv convert [SOURCE] --out DIR ...` and `latentkv convert-sweep` (convert/sweep.py: KV bytes per
token against behaviour and perplexity)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from latentkv.convert.api import convert
from latentkv.convert.budget import FORMATS
from latentkv.convert.options import ConvertOptions, rope_dim_arg, rope_window_arg
from latentkv.convert.refine import INPUTS
from latentkv.convert.stock import TARGETS
from latentkv.convert.sweep import SIZES, markdown_table, merge_sweeps, run_sweep
from latentkv.facts import MODEL_DTYPES
from latentkv.sources.readers import SourceError

D = ConvertOptions()  # the defaults


def kv_rank_arg(text: str):
    """An int or "full"."""
    return text if text == "full" else int(text)


def register(subparsers) -> None:
    """Add the convert and convert-sweep subcommands."""
    p = subparsers.add_parser(
        "convert",
        help="convert a Llama-family GQA/MHA model (GGUF or HF folder) to MLA",
        description="Training-free conversion to Multi-head Latent Attention. With no size "
        "option: the measured default (see docs/conversion.md).",
    )
    p.add_argument(
        "source",
        nargs="?",
        default=None,
        help="a .gguf file or a Hugging Face folder (default: bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--rope-dim", type=rope_dim_arg, default=None, help="rope dims kept per token (even int, or 'all': exact)"
    )
    p.add_argument("--kv-rank", type=kv_rank_arg, default=None, help="latent width (mean over layers), or 'full'")
    p.add_argument(
        "--cache-ratio", type=float, default=None, help="cache elements as a fraction of the source's (e.g. 0.5)"
    )
    p.add_argument(
        "--kv-bytes",
        type=int,
        default=None,
        metavar="N",
        help="instead of sizes: a budget of served KV cache bytes per token (all layers, scales included); "
        "the rope dim, rank and cache format with the best measured chat agreement within it, recorded "
        "as the folder's default cache (e.g. 12240: llama.cpp's q8_0 KV cache of SmolLM2); "
        "the transform-coded format (bits per latent direction) is decoded by its own native kernel "
        "(prompts: the reference attention, dequantized)",
    )
    p.add_argument(
        "--kv-formats",
        nargs="+",
        type=str,
        default=None,
        choices=list(FORMATS),
        help="the cache formats --kv-bytes tries (default: all; leave out transform_code for a folder the "
        "native kernels serve)",
    )
    p.add_argument(
        "--kv-rope-dims",
        nargs="+",
        type=rope_dim_arg,
        default=None,
        metavar="DR",
        help="the rope dims --kv-bytes tries (even ints or 'all'; default: a grid of 6)",
    )
    p.add_argument(
        "--calib",
        nargs="+",
        default=None,
        metavar="FILE",
        help="calibration text (.txt, or .jsonl with a 'text' field)",
    )
    p.add_argument("--calib-tokens", type=int, default=None, help=f"calibration tokens (default {D.calib_tokens})")
    p.add_argument(
        "--calib-chat",
        type=float,
        default=None,
        help=f"share of calibration tokens from chat conversations in the source's template "
        f"(default {D.calib_chat:g}; 0: documents only)",
    )
    p.add_argument(
        "--calib-weight",
        type=float,
        default=None,
        help=f"weight of the chat answers' and control tokens' positions in the calibration statistics "
        f"(default {D.calib_weight:g}: every position the same)",
    )
    p.add_argument(
        "--stock", action="store_true", help="plain deepseek_v3 checkpoint that unmodified transformers/vLLM load"
    )
    p.add_argument(
        "--target",
        default=D.target,
        choices=list(TARGETS),
        help="stock: the engine whose MLA widths (kv rank + rope) to snap to: vllm 320/512/576, "
        "vllm-cpu and flashmla 576, any: as asked",
    )
    p.add_argument(
        "--stock-width",
        type=int,
        default=None,
        help="stock: force this kv rank + rope width (e.g. 576); above what the source needs is zero-padded",
    )
    p.add_argument("--dtype", default=D.dtype, choices=list(MODEL_DTYPES))
    p.add_argument(
        "--calib-dtype",
        default=D.calib_dtype,
        choices=["auto", *MODEL_DTYPES],
        help="calibration forward matmuls (auto: bfloat16 where the CPU/GPU has it natively, else "
        "float32; statistics stay float32)",
    )
    p.add_argument("--ctx", type=int, default=D.ctx, help="calibration / evaluation window length")
    p.add_argument(
        "--eval-tokens",
        type=int,
        default=None,
        help=f"held-out tokens to measure perplexity on (default {D.eval_tokens}; 0: skip)",
    )
    p.add_argument(
        "--k-weight",
        type=float,
        default=None,
        help=f"weight of key against value error in the latent (default {D.k_weight:g}, measured)",
    )
    p.add_argument(
        "--rope-window",
        type=rope_window_arg,
        default=D.rope_window,
        help=f"query-key distances (tokens) over which a dropped rope pair's mean phase is measured "
        f"(default {D.rope_window}; 'all': the whole calibration window)",
    )
    p.add_argument(
        "--refine-steps",
        type=int,
        default=None,
        help=f"Adam steps per layer fitting its attention output to the source's on the calibration "
        f"windows after the closed form (default {D.refine_steps}: off)",
    )
    p.add_argument(
        "--refine-lr",
        type=float,
        default=None,
        help=f"refinement step relative to each tensor's scale (default {D.refine_lr:g})",
    )
    p.add_argument(
        "--refine-inputs",
        default=None,
        choices=list(INPUTS),
        help=f"each refined layer's inputs: the converted layers below it or the source's (default {D.refine_inputs})",
    )
    p.set_defaults(func=run)
    register_sweep(subparsers)


def run(args: argparse.Namespace) -> int:
    """Run a conversion; errors in the source or options are one clear line and exit 2."""
    given = {
        f.name: getattr(args, f.name) for f in fields(ConvertOptions) if getattr(args, f.name, None) is not None
    }  # an option left out keeps its default
    for name in ("kv_formats", "kv_rope_dims"):
        if given.get(name):
            given[name] = tuple(given[name])
    given["rope_window"] = args.rope_window  # None means "all" here, not "left out"
    try:
        out = convert(args.source, out=args.out, options=ConvertOptions(**given))
    except (SourceError, ValueError, FileNotFoundError) as err:
        print(f"latentkv convert: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    card = (out / "README.md").read_text()
    if "## Measured" in card:
        print(card[card.index("## Measured") :])
    return 0


def register_sweep(subparsers) -> None:
    """Add `convert-sweep`."""
    p = subparsers.add_parser(
        "convert-sweep", help="KV bytes per token vs behaviour and perplexity of converted models (table + PNG)"
    )
    p.add_argument("source", nargs="?", default=None, help="source model (default: bundled SmolLM2)")
    p.add_argument("--out", default="sweep", help="folder for sweep.md, sweep.json, sweep.png")
    p.add_argument("--rope-dims", type=rope_dim_arg, nargs="+", default=[64, 32], help="even ints or 'all'")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--ranks", type=int, nargs="+", default=None, help="latent ranks for every rope dim")
    size.add_argument(
        "--sizes",
        type=float,
        nargs="+",
        default=None,
        help=f"cache sizes as fractions of the source's elements; each rope dim gets the rank that "
        f"makes them (default {' '.join(map(str, SIZES))}; 1: the full rank)",
    )
    p.add_argument("--formats", nargs="+", default=["native", "stock"], choices=["native", "stock"])
    p.add_argument("--calib-tokens", type=int, default=D.calib_tokens)
    p.add_argument("--calib-chat", type=float, default=D.calib_chat, help="share of calibration tokens from chat")
    p.add_argument(
        "--calib-weight",
        type=float,
        default=D.calib_weight,
        help="weight of the chat answers' and control tokens' positions in the calibration statistics",
    )
    p.add_argument(
        "--rope-window",
        type=rope_window_arg,
        default=D.rope_window,
        help=f"distances over which dropped rope pairs' mean phases are measured (default {D.rope_window}; 'all')",
    )
    p.add_argument(
        "--refine-steps",
        type=int,
        nargs="+",
        default=[0],
        help="measure each point refined with each of these step counts (default 0: the closed form)",
    )
    p.add_argument(
        "--refine-lr", type=float, default=D.refine_lr, help="refinement step, relative to each tensor's scale"
    )
    p.add_argument("--eval-tokens", type=int, default=4096, help="tokens per perplexity domain")
    p.add_argument(
        "--chat-examples", type=int, default=None, help="held-out chat prompts to judge on (default all; 0: none)"
    )
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument(
        "--int8-formats",
        nargs="*",
        default=["native", "stock"],
        choices=["native", "stock"],
        help="formats also measured with an int8 latent",
    )
    p.add_argument(
        "--stats-cache", default=None, help="safetensors file: reuse calibration statistics (written if absent)"
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="measure nothing: merge these runs' sweep.json (same protocol and source) into --out",
    )
    p.set_defaults(func=run_sweep_command)


def run_sweep_command(args: argparse.Namespace) -> int:
    if args.merge:
        result = merge_sweeps(args.merge, args.out)
        print(markdown_table(result["rows"], result["source_ppl"], result["source_bytes_bf16"]))
        print(f"default by the bar: {result['default'] or 'no point meets it'}")
        return 0
    run_sweep(
        args.source,
        args.out,
        args.rope_dims,
        args.formats,
        args.ranks,
        args.calib_tokens,
        args.eval_tokens,
        args.ctx,
        int8_formats=args.int8_formats,
        stats_cache=args.stats_cache,
        calib_chat=args.calib_chat,
        chat_examples=args.chat_examples,
        sizes=args.sizes,
        calib_weight=args.calib_weight,
        rope_window=args.rope_window,
        refine_steps=args.refine_steps,
        refine_lr=args.refine_lr,
    )
    return 0
