"""`latentkv eval ppl MODEL... [--text FILE... | --domains ...]` and `latentkv eval chat MODEL --reference SOURCE`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from latentkv.eval.chat import EXTRA_TOKENS, evaluate_chat, format_table, print_degenerate
from latentkv.eval.domains import DOMAINS, domain_perplexity, format_domain_table
from latentkv.eval.repetition import RULE
from latentkv.eval.scorer import evaluate
from latentkv.facts import CACHE_DTYPES
from latentkv.model.quant import QUANTIZATIONS
from latentkv.sources.readers import SourceError

MODEL_HELP = "a .gguf, a Llama-family HF folder, or an MLA (deepseek_v2/v3) folder; default: bundled SmolLM2"
ERRORS = (SourceError, ValueError, FileNotFoundError, OSError)


def register(subparsers) -> None:
    """Add `eval` with its `ppl` and `chat` subcommands."""
    p = subparsers.add_parser("eval", help="measure quality (perplexity, chat behaviour against the original)")
    sub = p.add_subparsers(dest="eval_command", metavar="WHAT")
    ppl = sub.add_parser("ppl", help="perplexity over non-overlapping windows, source or converted model alike")
    ppl.add_argument(
        "model",
        nargs="*",
        default=None,
        help=f"{MODEL_HELP}; with --domains several models, the first the baseline of the ratios",
    )
    ppl.add_argument(
        "--text", nargs="+", default=None, metavar="FILE", help="text files (default: the held-out Python docs)"
    )
    ppl.add_argument(
        "--domains",
        nargs="*",
        default=None,
        choices=list(DOMAINS),
        metavar="DOMAIN",
        help=f"score each model on each domain ({', '.join(DOMAINS)}; none named: all) and print one table",
    )
    ppl.add_argument("--ctx", type=int, default=512, help="window length in tokens")
    ppl.add_argument(
        "--max-tokens", type=int, default=None, help="score at most this many tokens (per domain; default 8192 there)"
    )
    ppl.add_argument("--cache-dtype", default="auto", choices=list(CACHE_DTYPES), help="latent cache (MLA models)")
    ppl.add_argument(
        "--quantization",
        default=None,
        choices=QUANTIZATIONS,
        help="quantized linears (MLA models): int8 / int4 weights, or w4a8 / w8a8 (int8 activations too)",
    )
    ppl.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="model dtype (MLA models; bfloat16 is how CPU serving runs, and int4's fast kernel path)",
    )
    ppl.add_argument(
        "--json",
        action="store_true",
        help='print {"ppl": ..., "tokens": ..., "ctx": ...} (with --domains: the whole result)',
    )
    ppl.set_defaults(func=run_ppl)
    chat = sub.add_parser(
        "chat",
        help="behaviour against the original on held-out chat prompts (top-1 agreement, KL, "
        "greedy match length, repetition)",
    )
    chat.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    chat.add_argument("--reference", default=None, help="the original model (default: the bundled SmolLM2 GGUF)")
    chat.add_argument("--split", default="heldout", choices=["heldout", "calib"], help="which chat prompts")
    chat.add_argument("--max-examples", type=int, default=None, help="the first N prompts only")
    chat.add_argument(
        "--extra-tokens",
        type=int,
        default=EXTRA_TOKENS,
        help="greedy answers may run this many tokens past the original's",
    )
    chat.add_argument(
        "--no-generate",
        action="store_true",
        help="teacher-forced metrics only (no greedy answers, no repetition check)",
    )
    chat.add_argument("--cache-dtype", default="auto", choices=list(CACHE_DTYPES), help="latent cache (MLA models)")
    chat.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype (MLA models)")
    chat.add_argument("--out", default=None, help="write the full result (per-prompt answers included) as JSON")
    chat.set_defaults(func=run_chat)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_ppl(args: argparse.Namespace) -> int:
    try:
        if args.domains is not None:
            if args.text or args.cache_dtype != "auto" or args.quantization:
                raise ValueError("--domains takes none of --text, --cache-dtype, --quantization")
            r = domain_perplexity(
                args.model or [None], args.domains or None, args.ctx, args.max_tokens or 8192, args.dtype
            )
            print(
                json.dumps(r)
                if args.json
                else f"protocol: {r['protocol']}, first {r['max_tokens']} tokens per domain\n" + format_domain_table(r)
            )
            return 0
        if len(args.model or []) > 1:
            raise ValueError("several models need --domains")
        r = evaluate(
            (args.model or [None])[0],
            args.text,
            args.ctx,
            args.max_tokens,
            args.cache_dtype,
            args.quantization,
            args.dtype,
        )
    except ERRORS as err:
        print(f"latentkv eval ppl: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ppl": r["ppl"], "tokens": r["tokens"], "ctx": r["ctx"]}))
    else:
        print(f"model: {r['model']}\ntext: {r['text']}\nprotocol: {r['protocol']}")
        print(f"perplexity {r['ppl']:.4f} over {r['tokens']} predicted tokens in {r['windows']} windows of {r['ctx']}")
    return 0


def run_chat(args: argparse.Namespace) -> int:
    try:
        r = evaluate_chat(
            args.model,
            args.reference,
            args.split,
            args.max_examples,
            args.dtype,
            args.cache_dtype,
            not args.no_generate,
            args.extra_tokens,
        )
    except ERRORS as err:
        print(f"latentkv eval chat: error: {err}", file=sys.stderr)
        return 2
    print(
        f"model: {r['model']}\nreference: {r['reference']}\nprompts: {r['split']} split, teacher-forced on the "
        f"reference's answers; {r['dtype']}, cache {r['cache_dtype']}"
    )
    print(format_table(r))
    if r["degenerate"] is not None:
        print(f"degenerate rule: {RULE}")
        print_degenerate(r)
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=1))
        print(f"written {args.out}")
    return 0
