"""`latentkv bench {memory,decode,step,throughput,prefix,serve,kernel,contention}`: each runs its baselines in the same
run, prints a table with ratios, and writes JSON + PNG under --out. `latentkv bench random-model` writes
a random-weight checkpoint of a real shape to bench with; `latentkv bench soak` (commands/bench_soak.py) loads
started servers for minutes."""

from __future__ import annotations

import argparse
import os

import torch

from latentkv.bench import (
    contention,
    decode,
    kernel,
    memory,
    prefix,
    serve,
    servers,
    store_restart,
    throughput,
)
from latentkv.bench.models import default_models
from latentkv.commands import bench_frontier, bench_models, bench_soak
from latentkv.commands.bench_args import add_threads_arg, set_threads
from latentkv.facts import ENGINE_CACHE_DTYPES, MODEL_DTYPES
from latentkv.model.quant import QUANTIZATIONS
from latentkv.sources.readers import default_gguf_path

BENCHES = {
    "memory": memory,
    "decode": decode,
    "throughput": throughput,
    "prefix": prefix,
    "store_restart": store_restart,
    "serve": serve,
    "kernel": kernel,
    "contention": contention,
}
KERNEL_FULL = {"batches": [1, 8, 32], "contexts": [1024, 4096, 8192, 16384, 32768], "repeats": 5, "calls": 5}
KERNEL_QUICK = {"batches": [1, 3], "contexts": [64, 200], "repeats": 2, "calls": 2}

FULL = {
    "contexts": [128, 1024, 4096, 8192],
    "tokens": 64,
    "repeats": 3,
    "concurrency": [1, 8, 32, 64],
    "prefixes": [1024, 4096],
    "min_prompt": 32,
    "max_prompt": 512,
    "min_output": 32,
    "max_output": 128,
}
QUICK = {
    "contexts": [64, 256],
    "tokens": 8,
    "repeats": 2,
    "concurrency": [1, 4],
    "prefixes": [64, 256],
    "min_prompt": 8,
    "max_prompt": 64,
    "min_output": 4,
    "max_output": 12,
}


def add_model_args(p: argparse.ArgumentParser, stock: bool = False, threads: bool = True) -> None:
    p.add_argument("--model", help="converted MLA folder (default: the bundled SmolLM2, converted and cached)")
    p.add_argument(
        "--source",
        help="the original model (GGUF file or HF folder) for the baselines (default: the bundled SmolLM2 GGUF)",
    )
    if stock:
        p.add_argument(
            "--stock", help="a --stock export of the same model, run with transformers' DeepseekV3ForCausalLM"
        )
    p.add_argument("--no-baselines", action="store_true", help="skip the baselines that need a source model")
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG (default: bench-results/)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test that finishes in about a minute")
    p.add_argument("--repeats", type=int, help="interleaved repeats per measurement")
    if threads:  # `bench serve` has its own --threads (cores per server)
        add_threads_arg(p)


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
    p.add_argument(
        "--prefill-repeats",
        type=int,
        default=1,
        help="prompts of each context's length every system prefills, interleaved (the median is "
        "reported; default 1: the context's own prompt)",
    )
    p.add_argument(
        "--reference-attention",
        action="store_true",
        help="also run every latentkv row on the PyTorch reference attention (native vs reference)",
    )
    p.add_argument(
        "--not-invariant",
        action="store_true",
        help="also run every latentkv row with batch_invariant off (what invariance costs)",
    )
    p.add_argument(
        "--eager",
        action="store_true",
        help="also run every latentkv row with enforce_eager (no decode plan: what the plan brings)",
    )
    p.add_argument(
        "--weights",
        nargs="+",
        default=["none", "int4"],
        choices=["none", "int4", "w4a8", "w4a8_g128"],
        help="latentkv weight precisions to run: none (the model dtype), int4 (the w4 rows) and/or w4a8 "
        "(int4 weights, int8 activations: integer dot products); int4 / w4a8 on CPU",
    )
    p.add_argument(
        "--kv-cache-dtypes",
        nargs="+",
        default=["auto", "int8"],
        choices=list(ENGINE_CACHE_DTYPES),
        help="latent cache dtypes per weight precision (each row loads its own model; rows that do not "
        "fit in memory together load one at a time, and one that does not fit alone is refused)",
    )
    p.set_defaults(func=lambda a: run("decode", a))

    p = sub.add_parser("throughput", help="concurrent requests: tokens/s, TTFT, ITL vs transformers generate")
    add_model_args(p)
    p.add_argument("--concurrency", type=int, nargs="+")
    p.add_argument(
        "--not-invariant",
        action="store_true",
        help="also run latentkv with batch_invariant off, interleaved (what invariance costs)",
    )
    p.add_argument(
        "--quantization", default=None, choices=QUANTIZATIONS, help="latentkv's weights (default: the model dtype)"
    )
    p.add_argument(
        "--kv-cache-dtype", default="auto", choices=list(ENGINE_CACHE_DTYPES), help="latentkv's latent cache dtype"
    )
    p.set_defaults(func=lambda a: run("throughput", a))

    p = sub.add_parser(
        "contention",
        help="batch-1 decode while other processes keep some cores busy: "
        "latentkv's own thread count vs a fixed one vs llama.cpp",
    )
    add_model_args(p)
    p.add_argument("--busy-cores", type=int, default=1, help="cores kept busy in the middle phase (default 1)")
    p.add_argument("--contexts", type=int, nargs=1, help="the prompt's tokens (default 128; --quick 64)")
    p.add_argument("--tokens", type=int, help="tokens decoded per measurement")
    p.add_argument(
        "--weights",
        default="w4a8",
        choices=["none", "int4", "w4a8", "w4a8_g128"],
        help="latentkv weights (default w4a8: int4 weights x int8 activations, as llama.cpp's Q4_1 x Q8)",
    )
    p.set_defaults(func=lambda a: run("contention", a))

    p = sub.add_parser("prefix", help="time to first token with a shared prefix, prefix cache on vs off")
    add_model_args(p)
    p.add_argument("--prefixes", type=int, nargs="+")
    p.add_argument(
        "--store",
        action="store_true",
        help="instead: TTFT after a restart, cold vs restored from the on-disk store; store bytes per "
        "token vs GQA/MHA; throughput with the store on vs off",
    )
    p.add_argument("--store-dir", help="store directory for --store (default: a temporary one, deleted after)")
    p.add_argument("--concurrency", type=int, nargs="+", help="--store: requests at once for the throughput part")
    p.set_defaults(func=lambda a: run("store_restart" if a.store else "prefix", a))

    p = sub.add_parser("serve", help="OpenAI-API load (N concurrent streaming requests): latentkv serve vs vllm serve")
    add_model_args(p, threads=False)
    p.add_argument("--concurrency", type=int, nargs="+")
    p.add_argument(
        "--systems",
        nargs="+",
        choices=list(servers.SYSTEMS),
        help="latentkv (--model), vllm-original (the source as an HF folder), vllm-stock (our 576 stock "
        "export), vllm-model (vLLM on the --model folder itself); default: latentkv vllm-original "
        "vllm-stock for a conversion, latentkv vllm-model for a folder that is no conversion (a "
        "DeepSeek checkpoint, `bench random-model`'s)",
    )
    p.add_argument(
        "--sampling",
        nargs="+",
        default=["greedy"],
        choices=list(serve.SAMPLING),
        help="sampling passes, each reported beside the others: greedy (temperature 0), chat (temperature "
        "0.7, top_p 0.9), default (no temperature sent: the server's default, 1.0, as vLLM's client)",
    )
    p.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="cores each server may use (pinned to the first N)"
    )
    p.add_argument("--cache-memory", default="1GiB", help="KV cache memory each server gets (default 1GiB)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto"] + [d for d in MODEL_DTYPES if d != "float16"],
        help="model dtype for every server (auto: bfloat16 where the CPU computes it natively, else "
        "float32; vLLM's MLA backend on AMX CPUs takes bfloat16 only and gets it)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=list(ENGINE_CACHE_DTYPES),
        help="latentkv's latent cache (auto: the folder's own format, else the model dtype; bfloat16 / "
        "float32: the unquantized latent); vLLM keeps its default cache (under --scenario pressure, "
        "also fp8 on the original where vLLM-CPU takes it: a row each)",
    )
    p.add_argument(
        "--quantization", default=None, choices=QUANTIZATIONS, help="latentkv's weights (default: the model dtype)"
    )
    p.add_argument(
        "--scenario",
        default="load",
        choices=["load", "pressure"],
        help="load: N requests at once for each --concurrency; pressure: KV memory for 8K tokens of the "
        "original's cache, 64 prompts of 1K tokens, 128 out, 32 in flight (sets those sizes)",
    )
    p.add_argument(
        "--vllm",
        default=".venv-vllm/bin/python",
        help="the python of vLLM's venv (`make install-vllm` puts vLLM-CPU there)",
    )
    p.add_argument(
        "--stock576", help="a --stock-width 576 export to serve with vLLM (default: the bundled model's, made once)"
    )
    p.add_argument("--port", type=int, default=8765, help="loopback port the servers take in turn")
    p.add_argument(
        "--response-format",
        metavar="SCHEMA",
        help="guide every request: a JSON schema file, or json_object (compare with a run without it)",
    )
    p.set_defaults(func=run_serve)

    p = sub.add_parser(
        "kernel",
        help="decode attention alone: native kernel vs PyTorch reference, GB/s of latent "
        "(or a MoE layer's experts: --moe; a step's sampling: --sampler)",
    )
    p.add_argument("--batches", type=int, nargs="+", help="sequences (with --moe: tokens) per call (default 1 8 32)")
    p.add_argument("--contexts", type=int, nargs="+", help="tokens per sequence (default 1K-32K)")
    p.add_argument(
        "--latents",
        nargs="+",
        default=["bf16", "int8"],
        choices=["bf16", "int8", "fp8_e4m3", "int8_rope8"],
        help="latent dtypes (bf16: the latent in the model dtype, which 'auto' picks for this CPU; int8_rope8: "
        "the rope key in int8 too, the bundled model's default conversion's cache)",
    )
    p.add_argument(
        "--zero-latent-query",
        action="store_true",
        help="queries with a zero latent part, as an exact conversion of a GQA model makes them (W_UK all zero: "
        "the bundled model's default conversion); the kernel then scores the rope key alone",
    )
    p.add_argument("--heads", type=int, help="query heads (default: the bundled model's default conversion, as served)")
    p.add_argument("--rank", type=int, help="latent rank (default: the bundled model's default conversion)")
    p.add_argument("--rope", type=int, help="rope dims (default: the bundled model's default conversion)")
    p.add_argument("--calls", type=int, help="back-to-back calls per timing")
    p.add_argument("--repeats", type=int, help="interleaved repeats (median)")
    p.add_argument(
        "--compare-isas",
        nargs="+",
        choices=["avx512", "avx2", "scalar"],
        default=[],
        help="also time the native kernel on these paths (their capabilities alone), interleaved (an A/B)",
    )
    p.add_argument(
        "--moe",
        metavar="DxIxExK+S",
        help="time a MoE layer's experts instead: hidden x expert width x experts x per token + shared "
        "(DeepSeek-V2-Lite: 2048x1408x64x6+2); the native call vs the per-expert loop, by --batches",
    )
    p.add_argument(
        "--moe-weights",
        nargs="+",
        default=["int4", "w4a8", "bf16"],
        choices=["float32", "bf16", "int8", "int4", "w8a8", "w4a8"],
        help="the MoE layer's weight kinds (quantized ones with the machine's auto activation dtype)",
    )
    p.add_argument(
        "--sampler",
        action="store_true",
        help="time a decode step's sampling instead: the native sampler vs its PyTorch reference ops, "
        "by --vocabs, --batches (rows) and sampling settings (greedy, the client default, chat, ...)",
    )
    p.add_argument("--vocabs", type=int, nargs="+", help="with --sampler: vocabulary sizes (default 49152 129280)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG (default: bench-results/)")
    add_threads_arg(p)
    p.set_defaults(func=run_kernel)

    bench_frontier.register(sub)
    bench_models.register(sub)
    bench_soak.register(sub)
    bench.set_defaults(func=lambda a: bench.print_help() or 2)


def run_kernel(args) -> int:
    set_threads(args)
    preset = KERNEL_QUICK if args.quick else KERNEL_FULL
    if args.sampler:
        preset = {
            **preset,
            "batches": [32] if not args.quick else [3],
            "vocabs": [1000] if args.quick else [49152, 129280],
            "calls": 2 if args.quick else 20,
        }
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    with torch.no_grad():
        kernel.run(args)
    return 0


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


def run_serve(args) -> int:
    # fill_defaults names the bundled GGUF when --source is absent: the source of the bundled model, not of any --model
    args.source_given = args.source is not None
    return run("serve", args)


def run(name: str, args) -> int:
    set_threads(args)
    fill_defaults(args)
    with torch.no_grad():
        BENCHES[name].run(args)
    return 0
