"""`latentkv convert [SOURCE] --out DIR ...` (and `latentkv convert-sweep`, see sweep.py)."""
from __future__ import annotations

import argparse
import sys

from latentkv.convert import sweep
from latentkv.convert.api import DEFAULT_CALIB_TOKENS, DEFAULT_EVAL_TOKENS, convert
from latentkv.convert.sources import SourceError
from latentkv.facts import MODEL_DTYPES


def rope_dim_arg(text: str):
    """An even int or "all"."""
    return text if text == "all" else int(text)


def kv_rank_arg(text: str):
    """An int or "full"."""
    return text if text == "full" else int(text)


# flag, default, argparse keywords: each lost to the default in docs/conversion.md's ablations
EXPERT_OPTIONS = [
    ("--weighting", "attention", dict(choices=["attention", "aware", "balanced"],
                                      help="latent error weighting (aware +10.8%%, balanced +12.0%% vs attention +8.1%%)")),
    ("--k-weight", 5.0, dict(type=float, help="key against value error weight (5 measured best)")),
    ("--rank-alloc", "uniform", dict(choices=["uniform", "spectrum", "measured"],
                                     help="per-layer ranks under the global budget (both non-uniform ones lost)")),
    ("--sequential", False, dict(action="store_true",
                                 help="refit each latent on converted activations (< 1%% better, 2x calibration)")),
]


def expert_options_used(args: argparse.Namespace) -> list[str]:
    """The expert flags given a non-default value."""
    return [flag for flag, default, _ in EXPERT_OPTIONS if getattr(args, flag[2:].replace("-", "_")) != default]


def register(subparsers) -> None:
    """Add the convert and convert-sweep subcommands."""
    p = subparsers.add_parser("convert", help="convert a Llama-family GQA/MHA model (GGUF or HF folder) to MLA",
                              description="Training-free conversion to Multi-head Latent Attention. With no size "
                              "option: the measured default (see docs/conversion.md).")
    p.add_argument("source", nargs="?", default=None, help="a .gguf file or a Hugging Face folder (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--rope-dim", type=rope_dim_arg, default=None, help="rope dims kept per token (even int, or 'all': exact)")
    p.add_argument("--kv-rank", type=kv_rank_arg, default=None, help="latent width (mean over layers), or 'full'")
    p.add_argument("--cache-ratio", type=float, default=None, help="cache elements as a fraction of the source's (e.g. 0.5)")
    p.add_argument("--calib", nargs="+", default=None, metavar="FILE", help="calibration text (.txt, or .jsonl with a 'text' field)")
    p.add_argument("--calib-tokens", type=int, default=None, help="calibration tokens (default 32768)")
    p.add_argument("--stock", action="store_true", help="plain deepseek_v3 checkpoint that unmodified transformers/vLLM load")
    p.add_argument("--dtype", default="float32", choices=list(MODEL_DTYPES))
    p.add_argument("--ctx", type=int, default=512, help="calibration / evaluation window length")
    p.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens to measure perplexity on (0: skip)")
    expert = p.add_argument_group("expert options", "research knobs that measured worse or marginal on SmolLM2 "
                                  "(docs/conversion.md); they take effect only with --expert")
    expert.add_argument("--expert", action="store_true", help="allow the options below")
    for flag, default, kwargs in EXPERT_OPTIONS:
        expert.add_argument(flag, default=default, **kwargs)
    p.set_defaults(func=run)
    sweep.register(subparsers)


def run(args: argparse.Namespace) -> int:
    """Run a conversion; errors in the source or options are one clear line and exit 2."""
    if not args.expert and expert_options_used(args):
        print(f"latentkv convert: error: {', '.join(expert_options_used(args))} need --expert "
              "(they measured worse than the defaults, see docs/conversion.md)", file=sys.stderr)
        return 2
    try:
        out = convert(args.source, out=args.out, rope_dim=args.rope_dim, kv_rank=args.kv_rank,
                      cache_ratio=args.cache_ratio, calib=args.calib,
                      calib_tokens=args.calib_tokens or DEFAULT_CALIB_TOKENS, stock=args.stock, dtype=args.dtype,
                      ctx=args.ctx, eval_tokens=DEFAULT_EVAL_TOKENS if args.eval_tokens is None else args.eval_tokens,
                      weighting=args.weighting, rank_alloc=args.rank_alloc, sequential=args.sequential,
                      k_weight=args.k_weight)
    except (SourceError, ValueError, FileNotFoundError) as err:
        print(f"latentkv convert: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    card = (out / "README.md").read_text()
    if "## Measured" in card:
        print(card[card.index("## Measured"):])
    return 0
