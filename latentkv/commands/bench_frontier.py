"""`latentkv bench frontier`: KV cache bytes per token against chat behaviour and perplexity — llama.cpp's KV
types and KIVI-style quantizations of the original against latentkv conversions by budget."""

from __future__ import annotations

from latentkv.bench import frontier
from latentkv.commands.bench_args import add_threads_arg, set_threads
from latentkv.convert.budget import FORMATS


def register(sub) -> None:
    p = sub.add_parser(
        "frontier",
        help="KV cache bytes per token vs chat behaviour and perplexity: llama.cpp's "
        "f16 / q8_0 / q4_0 KV cache of the original vs latentkv conversions by budget",
    )
    p.add_argument("--source", help="the original model (a GGUF for the llama.cpp rows; default: the bundled SmolLM2)")
    p.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        help="`convert --kv-bytes` budgets (default: the original's q8_0 and q4_0 KV bytes and a quarter of its f16)",
    )
    p.add_argument(
        "--folders",
        nargs="+",
        metavar="DIR[:CACHE_DTYPE]",
        help="converted folders to measure too, each in the cache dtype given or its own default",
    )
    p.add_argument("--out", default="bench-results/frontier", help="folder for the conversions, JSON, table and PNG")
    p.add_argument(
        "--systems",
        nargs="+",
        default=list(frontier.SYSTEMS),
        choices=list(frontier.SYSTEMS),
        help="llama.cpp: the original GGUF in llama.cpp per KV type; reference: the original's float32 forward "
        "with its K and V through each llama.cpp KV type; kivi: the same with KIVI-style 2-4-bit K and V; "
        "latentkv: the conversions",
    )
    p.add_argument(
        "--kv-formats",
        nargs="+",
        choices=list(FORMATS),
        help="the cache formats each budget's `convert --kv-bytes` tries (default: all)",
    )
    p.add_argument(
        "--kv-rope-dims",
        nargs="+",
        metavar="DR",
        help="the rope dims each budget's conversion tries (even ints or 'all'; default: a grid of 6)",
    )
    p.add_argument(
        "--quick", action="store_true", help="3 chat prompts, short windows, a small calibration: a smoke test"
    )
    add_threads_arg(p)
    p.set_defaults(func=run_frontier)


def run_frontier(args) -> int:
    set_threads(args)
    frontier.run(args)
    return 0
