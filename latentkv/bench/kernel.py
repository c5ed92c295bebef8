"""`latentkv bench kernel`: paged MLA decode attention alone, native kernel vs the PyTorch
reference in the same run: GB/s of latent read and the share of this machine's measured
bandwidth, by batch, context and latent dtype (the CPU's flags printed with the table).
With `--moe SHAPE`, a MoE layer's experts instead (bench/moe_kernel.py); with `--sampler`, a decode
step's sampling (bench/sampler_kernel.py).

Each configuration fills caches of B sequences x context tokens on shuffled blocks (as a
long-running server's are) and times one layer's `latent_attention` call: a decode step
runs it once per layer. Bytes read = B x context x the latent bytes per token of one layer.
Successive calls go to successive copies ("layers"), as many as make the bytes of one round at
least twice the last-level cache: a small cache timed over and over would be read from L3, not
memory (B=1 at 8K is 5 MB of bf16 latent; this EPYC's L3 is 32 MB). The `layers` column says
how many copies a configuration rotated over and `round MiB` the bytes of one round (below the
L3 size only for tiny --quick configurations, capped at MAX_LAYERS copies).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import cpu
from ..attention.metadata import build_metadata
from ..attention.torch_ref import TorchBackend
from ..cache.accounting import latent_bytes
from ..cache.latent_cache import LatentCache
from ..config import ModelConfig
from ..facts import dtype_name
from ..kernels import attention as attention_kernels
from ..model.loader import resolve_dtype
from ..plots import new_figure, save_figure
from . import moe_kernel, sampler_kernel
from .bandwidth import llc_bytes, measure_bandwidth
from .models import default_models
from .report import median, print_table, write_json

BLOCK = 16
MAX_LAYERS = 256  # tiny configurations (--quick) stop here: their "round MiB" column shows they sit in cache


def random_cache(batch: int, context: int, rank: int, rope: int, dtype: torch.dtype, cache_dtype: str, seed: int):
    """A cache holding `batch` sequences of `context` random latents on shuffled blocks -> (cache, tables)."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-context // BLOCK)
    cache = LatentCache(batch * per_seq + 1, BLOCK, rank, rope, dtype, cache_dtype)
    if cache.quantized:
        cache.latent.copy_(
            torch.randint(-127, 128, cache.latent.shape, generator=gen, dtype=torch.int8).view(cache.latent.dtype)
        )
        if cache_dtype == "fp8_e4m3":  # random bytes include NaN codes; use real ones
            cache.latent.copy_(torch.randn(cache.latent.shape, generator=gen).to(torch.float8_e4m3fn).view(torch.uint8))
        cache.scale.uniform_(0.001, 0.01, generator=gen)
        if cache.rope8:  # int8 rope codes, their scale the token's second
            cache.rope.copy_(torch.randint(-127, 128, cache.rope.shape, generator=gen, dtype=torch.int8))
        else:
            cache.rope.normal_(generator=gen)
    else:
        cache.kv.normal_(generator=gen)
    blocks = (torch.randperm(batch * per_seq, generator=gen) + 1).view(batch, per_seq).tolist()
    return cache, blocks


def timed(fns: list, calls: int) -> float:
    """Seconds per call of `calls` back-to-back calls, each on the next of `fns` (the layers)."""
    start = time.perf_counter()
    for i in range(calls):
        fns[i % len(fns)]()
    return (time.perf_counter() - start) / calls


def measure(batch: int, context: int, args, dtype: torch.dtype, cache_dtype: str, threads: int, llc: int) -> dict:
    per_token = latent_bytes([args.rank], args.rope, cache_dtype, dtype_name(dtype))
    nbytes = batch * context * per_token
    layers = min(-(-2 * llc // nbytes), MAX_LAYERS)  # one round reads at least twice the last-level cache
    query = (torch.randn(batch, args.heads, args.rank + args.rope) * (args.rank + args.rope) ** -0.5).to(dtype)
    if getattr(args, "zero_latent_query", False):  # an exact GQA conversion's: W_UK all zero
        query[..., : args.rank] = 0
    isas = [
        isa
        for isa in getattr(args, "compare_isas", None) or []
        if attention_kernels.available()
        and isa != attention_kernels.chosen_isa()
        and isa in attention_kernels.supported_isas()
    ]
    runs = {"reference": [], "native": [], **{f"native {isa}": [] for isa in isas}}
    for layer in range(layers):
        cache, tables = random_cache(
            batch, context, args.rank, args.rope, dtype, cache_dtype, seed=batch * 7 + context + 1000 * layer
        )
        meta, _ = build_metadata([1] * batch, [context] * batch, tables, BLOCK)
        runs["reference"].append(lambda cache=cache, meta=meta: TorchBackend().latent_attention(query, cache, meta))
        if attention_kernels.available():
            runs["native"].append(
                lambda cache=cache, meta=meta: attention_kernels.mla_decode(
                    query, cache, meta.block_tables, meta.context_lens, heads=args.heads, threads=threads
                )
            )
            for isa in isas:  # the same kernel on a lower instruction set: an A/B in the same minutes
                runs[f"native {isa}"].append(
                    lambda cache=cache, meta=meta, isa=isa: attention_kernels.mla_decode(
                        query, cache, meta.block_tables, meta.context_lens, heads=args.heads, path=isa, threads=threads
                    )
                )
    runs = {name: fns for name, fns in runs.items() if fns}
    calls = max(args.calls, layers)  # every layer at least once per timing
    times = {name: [] for name in runs}
    for fns in runs.values():
        timed(fns, layers)  # warm-up: touch every layer once
    for _ in range(args.repeats):  # interleaved
        for name, fns in runs.items():
            times[name].append(timed(fns, calls))
    row = {
        "batch": batch,
        "context": context,
        "latent": cache_dtype if cache_dtype != "auto" else dtype_name(dtype),
        "layers": layers,
        "round MiB": layers * nbytes / 2**20,
        "bytes": nbytes,
    }
    for name, values in times.items():
        seconds = median(values)
        row[f"{name} ms"] = seconds * 1e3
        row[f"{name} GB/s"] = nbytes / seconds / 1e9
    return row


def default_shape(args) -> None:
    """Heads, rank and rope not given: those of the bundled model's default conversion (what
    `serve` runs; converted on first use like the other benches)."""
    if None in (args.heads, args.rank, args.rope):
        cfg = ModelConfig.from_file(Path(default_models(False)[0]) / "config.json")
        args.heads = args.heads or cfg.num_attention_heads
        args.rank = args.rank or cfg.kv_lora_rank
        args.rope = cfg.qk_rope_head_dim if args.rope is None else args.rope


def run(args) -> dict:
    if getattr(args, "moe", None):  # a MoE layer's experts instead of attention
        return moe_kernel.run(args)
    if getattr(args, "sampler", False):  # a step's sampling instead of attention
        return sampler_kernel.run(args)
    out = Path(args.out)
    default_shape(args)
    zero_query = getattr(args, "zero_latent_query", False)
    threads = torch.get_num_threads()
    dtype = resolve_dtype("auto", torch.device("cpu"))
    isa = attention_kernels.chosen_isa() if attention_kernels.available() else None
    print(
        f"{threads} threads; model dtype (auto) {dtype_name(dtype)}; native kernel: "
        + (
            f"{isa} (runs {', '.join(attention_kernels.supported_isas())})"
            if isa
            else f"unavailable ({attention_kernels.unavailable_reason()})"
        )
    )
    bandwidth, llc = measure_bandwidth(), llc_bytes()
    print(
        f"measured bandwidth (copy, read + write): {bandwidth / 1e9:.1f} GB/s; last-level cache {llc / 2**20:.0f} MiB "
        "(each configuration rotates over enough layers to read at least twice that per round)",
        flush=True,
    )
    configs = [(b, c, k) for k in args.latents for b in args.batches for c in args.contexts]
    rows = []
    for batch, context, latent in tqdm(configs, desc="kernel", unit="config"):
        row = measure(batch, context, args, dtype, "auto" if latent == "bf16" else latent, threads, llc)
        for name in [k[: -len(" GB/s")] for k in list(row) if k.endswith(" GB/s")]:
            row[f"{name} % bw"] = 100 * row[f"{name} GB/s"] * 1e9 / bandwidth
        if "native ms" in row:
            row["native speed-up"] = row["reference ms"] / row["native ms"]
        rows.append(row)
    shown = [{k: v for k, v in r.items() if k != "bytes"} for r in rows]
    print_table(
        f"Paged MLA decode attention, one layer (H={args.heads}, rank {args.rank}, rope {args.rope}"
        + ("; the query's latent part zero, as an exact conversion's" if zero_query else "")
        + f"; median of {args.repeats} x {args.calls} calls)",
        list(shown[0].keys()),
        shown,
    )
    plot(rows, out)
    payload = {
        "cpu_flags": cpu.features(),
        "isa": isa,
        "threads": threads,
        "bandwidth_gbs": bandwidth / 1e9,
        "llc_bytes": llc,
        "model_dtype": dtype_name(dtype),
        "heads": args.heads,
        "rank": args.rank,
        "rope": args.rope,
        "zero_latent_query": zero_query,
        "results": rows,
    }
    write_json(out, "kernel", payload)
    return payload


def plot(rows: list[dict], out: Path) -> Path:
    fig, ax = new_figure(
        "Decode attention: latent GB/s by context", "context (tokens)", "GB/s of latent read", log_x=True
    )
    for latent in dict.fromkeys(r["latent"] for r in rows):
        for batch in dict.fromkeys(r["batch"] for r in rows):
            sel = [r for r in rows if r["latent"] == latent and r["batch"] == batch]
            names = [k[: -len(" GB/s")] for k in sel[0] if k.endswith(" GB/s")]
            for name in names:
                style = "-" if name == "native" else ":" if name == "reference" else "--"
                if f"{name} GB/s" in sel[0]:
                    ax.plot(
                        [r["context"] for r in sel],
                        [r[f"{name} GB/s"] for r in sel],
                        style,
                        marker="o",
                        label=f"{name} {latent} B={batch}",
                    )
    return save_figure(fig, out, "kernel")
