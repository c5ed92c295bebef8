"""`latentkv bench step` (the decode step by batch size against what it reads) and `latentkv bench
random-model` (a random-weight checkpoint of a real DeepSeek shape, to bench with)."""

from __future__ import annotations

import sys

from latentkv.bench import random_model, step
from latentkv.bench.models import default_models
from latentkv.bench.shapes import SHAPES
from latentkv.commands.bench_args import add_threads_arg, set_threads
from latentkv.facts import ENGINE_CACHE_DTYPES
from latentkv.sizes import parse_memory


def register(sub) -> None:
    p = sub.add_parser("step", help="the decode step at N sequences vs the bandwidth floor of what it reads")
    p.add_argument("--model", help="MLA folder (default: the bundled SmolLM2, converted and cached)")
    p.add_argument("--weights", default="none", choices=["none", "int4", "w4a8", "w4a8_g128"], help="weight precision")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(ENGINE_CACHE_DTYPES))
    p.add_argument("--kv-cache-memory", help="latent cache size, e.g. 2GiB (default: the engine's)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="sequences per step")
    p.add_argument("--context", type=int, default=512, help="prompt tokens of each sequence (default 512)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per batch size (default 16)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="times every batch size is measured, in turn (each figure the median over rounds; `x first` "
        "against the first batch size of the same round): the machine's drift then reaches every batch alike",
    )
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG (default: bench-results/)")
    add_threads_arg(p)
    p.set_defaults(func=run_step)

    p = sub.add_parser(
        "random-model",
        help="write a seeded random-weight checkpoint of a real DeepSeek shape "
        "(a Hugging Face folder) to bench loading, memory and speed at that size",
    )
    p.add_argument(
        "--shape",
        required=True,
        choices=sorted(SHAPES),
        help="deepseek-v2-lite (the release's config: 15.7B parameters, 31 GB), deepseek-v3-mini (V3-style, "
        "1.9B), mid (133M: the test suite's memory check), tiny / tiny-v3 (unit tests)",
    )
    p.add_argument("--out", required=True, help="the folder to write (its old shards are removed)")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same bytes (default 0)")
    p.add_argument("--shard-size", type=parse_memory, help="safetensors shard size, e.g. 512MiB (default 1GiB)")
    p.add_argument(
        "--gguf",
        nargs="?",
        const="",
        metavar="PATH",
        help="also write the folder as a Q4_0 GGUF holding the same values (default path: <out>-Q4_0.gguf)",
    )
    p.set_defaults(func=run_random_model)


def run_step(args) -> int:
    for name in ("steps", "rounds", "context"):
        if getattr(args, name) < 1:
            print(f"latentkv bench step: --{name} must be at least 1 (got {getattr(args, name)})", file=sys.stderr)
            return 2
    if min(args.batches) < 1:
        print(f"latentkv bench step: every --batches size must be at least 1 (got {args.batches})", file=sys.stderr)
        return 2
    set_threads(args)
    args.model = args.model or default_models(need_stock=False)[0]
    step.run(args)
    return 0


def run_random_model(args) -> int:
    try:
        out = random_model.write_random_model(args.shape, args.out, args.seed, args.shard_size)
    except ValueError as err:
        print(f"latentkv bench random-model: {err}", file=sys.stderr)
        return 2
    print(f"latentkv bench random-model: wrote {out}")
    if args.gguf is not None:
        print(f"latentkv bench random-model: wrote {random_model.write_gguf_twin(out, args.gguf or None)}")
    return 0
