"""`latentkv eval ppl MODEL --text FILE... [--ctx 512] [--json]`."""
from __future__ import annotations

import argparse
import json
import sys

from latentkv.convert.sources import SourceError
from latentkv.eval.ppl import evaluate
from latentkv.facts import CACHE_DTYPES


def register(subparsers) -> None:
    """Add `eval` with its `ppl` subcommand."""
    p = subparsers.add_parser("eval", help="measure quality (perplexity)")
    sub = p.add_subparsers(dest="eval_command", metavar="WHAT")
    ppl = sub.add_parser("ppl", help="perplexity over non-overlapping windows, source or converted model alike")
    ppl.add_argument("model", nargs="?", default=None,
                     help="a .gguf, a Llama-family HF folder, or an MLA (deepseek_v2/v3) folder; default: bundled SmolLM2")
    ppl.add_argument("--text", nargs="+", default=None, metavar="FILE", help="text files (default: the held-out Python docs)")
    ppl.add_argument("--ctx", type=int, default=512, help="window length in tokens")
    ppl.add_argument("--max-tokens", type=int, default=None, help="score at most this many tokens")
    ppl.add_argument("--cache-dtype", default="auto", choices=list(CACHE_DTYPES), help="latent cache (MLA models)")
    ppl.add_argument("--quantization", default=None, choices=["int8", "int4"], help="weight-only quantized linears (MLA models)")
    ppl.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                     help="model dtype (MLA models; bfloat16 is how CPU serving runs, and int4's fast kernel path)")
    ppl.add_argument("--json", action="store_true", help='print {"ppl": ..., "tokens": ..., "ctx": ...}')
    ppl.set_defaults(func=run_ppl)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_ppl(args: argparse.Namespace) -> int:
    try:
        r = evaluate(args.model, args.text, args.ctx, args.max_tokens, args.cache_dtype, args.quantization,
                     args.dtype)
    except (SourceError, ValueError, FileNotFoundError, OSError) as err:
        print(f"latentkv eval ppl: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ppl": r["ppl"], "tokens": r["tokens"], "ctx": r["ctx"]}))
    else:
        print(f"model: {r['model']}\ntext: {r['text']}\nprotocol: {r['protocol']}")
        print(f"perplexity {r['ppl']:.4f} over {r['tokens']} predicted tokens in {r['windows']} windows of {r['ctx']}")
    return 0
