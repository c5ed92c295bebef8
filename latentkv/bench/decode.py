"""`latentkv bench decode`: batch-1 greedy decode tokens/s at several contexts, our engine
(the row "latentkv" in the model dtype `auto` resolves to on this CPU, bf16 or float32, printed;
beside it the int8 latent and int4 weights) against transformers on the original model, transformers'
DeepseekV3 on the stock export, and llama.cpp when installed; with the bandwidth floor.
Also each system's prefill of the context's prompt (tokens/s), timed when it first sees it.

Memory: each latentkv row is an engine with its own copy of the model. Before any is loaded, the
loader's estimate (model/footprint.py) of every row is set against the memory available: when all
fit beside the baselines they are loaded together and timed interleaved with them; otherwise one at
a time (the first beside the baselines, which then close; each engine freed before the next loads);
when even one does not fit, the bench refuses, naming the sizes, before loading anything."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cache.accounting import latent_bytes_per_token
from ..config import ModelConfig
from ..facts import ENGINE_CACHE_DTYPES, dtype_name
from ..model.footprint import GIB, load_bytes
from ..model.loader import meta_model
from ..model.route import decide_route
from ..plots import new_figure, save_figure
from ..sizes import available_memory, parse_memory, return_freed_memory
from .bandwidth import decode_floor_seconds, measure_bandwidth, weight_bytes
from .isolated import FAILED, attempt, close_all
from .report import median, print_table, write_json
from .systems import (
    LatentKVSystem,
    auto_dtype,
    cache_budget,
    llama_cpp_available,
    llama_cpp_baseline,
    transformers_baseline,
)


# --weights -> the row name's weight part
WEIGHT_ROWS = {"none": "", "int4": "w4", "w4a8": "w4a8", "w4a8_g128": "w4a8_g128"}
HEADROOM = 0.9  # of the memory available: what the engines and baselines may take (as transformers_cannot_load)


@dataclass(frozen=True)
class Row:
    """A latentkv row before it is loaded: its name and the engine options that differ from the defaults."""

    name: str
    kv_cache_dtype: str
    quantization: str | None = None
    options: tuple = ()  # (engine option, value) pairs: attention_backend, batch_invariant, enforce_eager

    def variant(self, suffix: str, **options) -> "Row":
        return Row(
            f"{self.name} ({suffix})",
            self.kv_cache_dtype,
            self.quantization,
            tuple({**dict(self.options), **options}.items()),
        )


def plan_rows(args) -> list[Row]:
    """The latentkv rows asked for; the first is the one the ratios are taken against. Quantized weights
    are reported separately (a different weight precision, like llama.cpp's Q4_1); int4 / w4a8 on CPU only."""
    weights = getattr(args, "weights", None) or ["none", "int4"]
    latents = getattr(args, "kv_cache_dtypes", None) or ["auto", "int8"]
    rows = []
    for weight in [w for w in WEIGHT_ROWS if w in weights and (w == "none" or not torch.cuda.is_available())]:
        for latent in [c for c in ENGINE_CACHE_DTYPES if c in latents]:
            name = " + ".join(
                part for part in (WEIGHT_ROWS[weight], "" if latent == "auto" else f"{latent} latent") if part
            )
            rows.append(Row(f"latentkv {name}".strip(), latent, None if weight == "none" else weight))
    if getattr(args, "reference_attention", False):  # the same rows on the PyTorch reference attention
        rows += [r.variant("torch attention", attention_backend="torch") for r in list(rows)]
    if getattr(args, "not_invariant", False):  # the same rows with batch_invariant off: the cost of invariance
        rows += [r.variant("not invariant", batch_invariant=False) for r in list(rows)]
    if getattr(args, "eager", False):  # the same rows through the modules (enforce_eager): what the decode plan brings
        rows += [r.variant("eager", enforce_eager=True) for r in list(rows) if not dict(r.options).get("enforce_eager")]
    return rows


def row_bytes(model: str, row: Row, cache: str) -> int:
    """What loading `row`'s engine takes: the loader's estimate for its weights (model/footprint.py, on
    the meta device: nothing is read) and its cache."""
    cfg = ModelConfig.from_file(Path(model) / "config.json")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    route = decide_route(device, auto_dtype(), dict(row.options).get("attention_backend", "auto"), row.quantization)
    return load_bytes(meta_model(cfg, route)) + parse_memory(cache)


def baseline_bytes(args) -> int:
    """Memory the baselines beside the first engine take that their own start does not check: llama.cpp's
    GGUF (its pages are read every token). transformers checks the memory left when it starts."""
    source = Path(args.source) if args.source else None
    if source is not None and source.suffix == ".gguf" and llama_cpp_available():
        return source.stat().st_size
    return 0


def plan_groups(rows: list[Row], need: dict[str, int], baselines: int, available: int) -> list[list[Row]]:
    """[all rows] when they fit together beside the baselines, else [[row], ...] one engine at a time
    (the first beside the baselines); SystemExit, naming the sizes, when a row does not fit even so."""
    room = HEADROOM * available
    if sum(need.values()) + baselines <= room:
        return [rows]
    for i, row in enumerate(rows):
        beside = baselines if i == 0 else 0
        if need[row.name] + beside > room:
            with_baselines = f" beside the baselines' {beside / GIB:.1f} GiB (llama.cpp's GGUF)" if beside else ""
            raise SystemExit(
                f"latentkv bench decode: {row.name!r} needs about {need[row.name] / GIB:.1f} GiB{with_baselines}, "
                f"{available / GIB:.1f} GiB is available (the bench uses {HEADROOM:.0%}); pass --weights w4a8 or int4, "
                "or --no-baselines, or free memory"
            )
    return [[row] for row in rows]


def load_row(row: Row, model: str, length: int, budget: str) -> LatentKVSystem:
    return LatentKVSystem(
        row.name,
        model,
        row.kv_cache_dtype,
        max_model_len=length,
        kv_cache_memory=budget,
        quantization=row.quantization,
        **dict(row.options),
    )


def free(systems: list[LatentKVSystem]) -> None:
    """Close the engines and give their memory back before the next ones load."""
    for s in systems:
        s.close()
    systems.clear()
    gc.collect()  # an engine's modules and runner refer to each other
    return_freed_memory()


def build_baselines(args, failed: dict) -> list:
    """The baselines, each in its own process (one that fails to start is in `failed`)."""
    systems = []
    if args.source:
        systems += transformers_baseline("transformers original", args.source, failed)
    if args.stock:
        systems += transformers_baseline("transformers DeepseekV3 stock", args.stock, failed)
    systems += llama_cpp_baseline("llama.cpp", args.source, n_ctx=max(args.contexts) + 2 * args.tokens, failed=failed)
    return systems


def measure_context(live: list, prompts: list[list[int]], args, failed: dict) -> tuple[dict, dict]:
    """One context: each system's prefill (tokens/s, the median over `prompts`, each new to it,
    interleaved A B C A B C; the last is the context decode runs on) and decode times; a system
    that fails is recorded in `failed` and removed from `live` (the bench goes on without it)."""
    samples, times = {s.name: [] for s in live}, {}
    for prompt in prompts:
        for s in list(live):
            start = time.perf_counter()
            if attempt(s, failed, "prepare", prompt) is FAILED:
                live.remove(s)
                del samples[s.name]
                continue
            samples[s.name].append(len(prompt) / (time.perf_counter() - start))
    prefill = {name: median(v) for name, v in samples.items()}
    for s in list(live):
        if (
            attempt(s, failed, "decode", min(4, args.tokens)) is FAILED
        ):  # warm-up: first-call costs are not decode speed
            live.remove(s)
            del prefill[s.name]
            continue
        times[s.name] = []
    for _ in range(args.repeats):  # interleaved: A B C A B C ...
        for s in list(live):
            seconds = attempt(s, failed, "decode", args.tokens)
            if seconds is FAILED:
                live.remove(s)
                del prefill[s.name], times[s.name]
            else:
                times[s.name].append(seconds)
    return prefill, times


def context_prompts(ctx: int, vocab: int, args) -> list[list[int]]:
    return [
        torch.randint(3, vocab, (ctx,), generator=torch.Generator().manual_seed(ctx + 7919 * r)).tolist()
        for r in range(getattr(args, "prefill_repeats", 1) - 1, -1, -1)
    ]  # the last: seed ctx, as before


def run(args) -> dict:
    out = Path(args.out)
    failed: dict[str, str] = {}
    length = max(args.contexts) + 2 * args.tokens
    budget = cache_budget(args.model, 3 * (length + 64))  # one context's cache (+ repeats), not a share of free memory
    rows = plan_rows(args)
    need = {r.name: row_bytes(args.model, r, budget) for r in rows}
    groups = plan_groups(rows, need, baseline_bytes(args), available_memory(torch.device("cpu")))
    if len(groups) > 1:
        print(
            f"latentkv bench decode: the {len(rows)} latentkv rows do not fit together ("
            + ", ".join(f"{n} ~{b / GIB:.1f} GiB" for n, b in need.items())
            + "): one engine at a time, the first timed interleaved with the baselines",
            flush=True,
        )
    vocab = ModelConfig.from_file(Path(args.model) / "config.json").vocab_size
    bandwidth = measure_bandwidth()
    ours = [r.name for r in rows]
    weights, per_token, names = {}, {}, list(ours)
    prefill = {ctx: {} for ctx in args.contexts}
    times = {ctx: {} for ctx in args.contexts}
    model_dtype = None
    for i, group in enumerate(groups):
        systems = [load_row(r, args.model, length, budget) for r in group]
        model_dtype = model_dtype or dtype_name(systems[0].engine.runner.dtype)
        for s in systems:  # bytes one step must read besides the cache (quantized weights as stored)
            weights[s.name] = weight_bytes(s.model)
            per_token[s.name] = latent_bytes_per_token(
                s.engine.cfg, s.engine.args.kv_cache_dtype, dtype_name(s.engine.runner.dtype)
            )
        baselines = build_baselines(args, failed) if i == 0 else []
        names += [b.name for b in baselines]
        live = systems + baselines
        for ctx in args.contexts:
            p, t = measure_context(live, context_prompts(ctx, vocab, args), args, failed)
            prefill[ctx].update(p)
            times[ctx].update(t)
            print(f"context {ctx}: " + ", ".join(f"{n} {1 / median(v):.2f} tok/s" for n, v in t.items()), flush=True)
        close_all(baselines)
        free(systems)
    results = []
    for ctx in args.contexts:
        results.append(summarize(ctx, times[ctx], ours, weights, per_token, bandwidth))
        results[-1]["prefill_tok_s"] = prefill[ctx]
        results[-1]["prefill_prompts"] = getattr(args, "prefill_repeats", 1)
    show(results, names, ours, bandwidth, weights, model_dtype)
    for name, reason in failed.items():
        print(f"{name}: failed (not in the tables from then on): {reason}\n", flush=True)
    plot(results, names, out)
    payload = {
        "model_dtype": model_dtype,
        "bandwidth_gbs": bandwidth / 1e9,
        "weight_bytes": weights,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "results": results,
        "failed": failed,
        "engines": "together" if len(groups) == 1 else "one at a time",
        "engine_bytes_estimate": need,
    }
    write_json(out, "decode", payload)
    return payload


def summarize(ctx: int, times: dict, ours: list[str], weights: dict, per_token: dict, bandwidth: float) -> dict:
    """tok_s per system; ratio: the first latentkv row over each system; speedup[ours][baseline] for
    every latentkv row over every baseline; floor_fraction: each latentkv row's share of its
    bandwidth bound (weights + cache bytes it must read per step / measured bandwidth)."""
    tok_s = {name: 1 / median(t) for name, t in times.items()}
    baselines = [n for n in tok_s if n not in ours]
    first = ours[0]
    row = {
        "context": ctx,
        "tok_s": tok_s,
        "ratio": {n: tok_s[first] / v for n, v in tok_s.items()},
        "speedup": {o: {b: tok_s[o] / tok_s[b] for b in baselines} for o in ours},
    }
    floors = {o: decode_floor_seconds(weights[o], per_token[o], ctx, bandwidth) for o in ours}
    row["floor_s"] = floors[first]
    row["floor_fraction"] = floors[first] * tok_s[first]
    row["floor_fractions"] = {o: floors[o] * tok_s[o] for o in ours}
    return row


def show(
    results: list[dict], names: list[str], ours: list[str], bandwidth: float, weights: dict, model_dtype: str
) -> None:
    rows = [{"context": r["context"], **{n: r["tok_s"].get(n) for n in names}} for r in results]
    print(
        f"model dtype {model_dtype} (dtype auto on this CPU); "
        f"memory bandwidth {bandwidth / 1e9:.1f} GB/s ({torch.get_num_threads()} threads); weights read per step: "
        + ", ".join(f"{n} {w / 2**20:.0f} MiB" for n, w in weights.items())
    )
    print_table("Batch-1 greedy decode (median tokens/s)", list(rows[0].keys()), rows)
    ratio_rows = []
    for r in results:
        for o in ours:
            ratio_rows.append(
                {
                    "context": r["context"],
                    "latentkv row": o,
                    **{f"x vs {b}": v for b, v in r["speedup"][o].items()},
                    "floor %": 100 * r["floor_fractions"][o],
                }
            )
    print_table(
        "Speed-up of each latentkv row over each baseline; share of its bandwidth floor",
        list(ratio_rows[0].keys()),
        ratio_rows,
    )
    # each prompt is new to the system (a prefix-cached one would be free): --prefill-repeats prompts a context
    prefill_rows = [{"context": r["context"], **{n: r["prefill_tok_s"].get(n) for n in names}} for r in results]
    print_table(
        f"Prefill of the context's prompt (tokens/s, median of {results[0]['prefill_prompts']} prompt(s) each)",
        list(prefill_rows[0].keys()),
        prefill_rows,
    )
    baselines = [n for n in names if n not in ours]
    if baselines:
        print_table(
            "Prefill speed-up of each latentkv row over each baseline",
            ["context", "latentkv row"] + [f"x vs {b}" for b in baselines],
            [
                {
                    "context": r["context"],
                    "latentkv row": o,
                    **{
                        f"x vs {b}": r["prefill_tok_s"][o] / r["prefill_tok_s"][b]
                        for b in baselines
                        if b in r["prefill_tok_s"]
                    },
                }
                for r in results
                for o in ours
            ],
        )


def plot(results: list[dict], names: list[str], out: Path) -> Path:
    fig, ax = new_figure("Batch-1 decode speed", "context (tokens)", "tokens/s", log_x=True)
    ctx = [r["context"] for r in results]
    for name in names:
        points = [(c, r["tok_s"][name]) for c, r in zip(ctx, results) if name in r["tok_s"]]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    return save_figure(fig, out, "decode")
