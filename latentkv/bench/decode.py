"""`latentkv bench decode`: batch-1 greedy decode tokens/s at several contexts, our engine
(the row "latentkv" in the model dtype `auto` resolves to on this CPU, bf16 or float32, printed;
beside it the int8 latent and int4 weights) against transformers on the original model, transformers'
DeepseekV3 on the stock export, and llama.cpp when installed; with the bandwidth floor.
Also each system's prefill of the context's prompt (tokens/s), timed when it first sees it."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..cache.accounting import latent_bytes_per_token
from ..facts import ENGINE_CACHE_DTYPES, dtype_name
from ..plots import new_figure, save_figure
from .bandwidth import decode_floor_seconds, measure_bandwidth, weight_bytes
from .isolated import FAILED, attempt, close_all
from .report import median, print_table, write_json
from .systems import LatentKVSystem, cache_budget, llama_cpp_baseline, transformers_baseline


WEIGHT_ROWS = {"none": "", "int4": "w4", "w4a8": "w4a8"}  # --weights -> the row name's weight part


def build_systems(args, failed: dict) -> list:
    """The latentkv rows, then the baselines (each in its own process; one that fails to start is in `failed`)."""
    length = max(args.contexts) + 2 * args.tokens
    budget = cache_budget(args.model, 3 * (length + 64))  # one context's cache (+ repeats), not a share of free memory
    weights = getattr(args, "weights", None) or ["none", "int4"]
    latents = getattr(args, "kv_cache_dtypes", None) or ["auto", "int8"]
    systems = []
    # the first latentkv row is the one the ratios are taken against; quantized weights are reported
    # separately (a different weight precision, like llama.cpp's Q4_1); int4 / w4a8 on CPU only
    for weight in [w for w in WEIGHT_ROWS if w in weights and (w == "none" or not torch.cuda.is_available())]:
        for latent in [c for c in ENGINE_CACHE_DTYPES if c in latents]:
            name = " + ".join(part for part in (WEIGHT_ROWS[weight], "" if latent == "auto" else f"{latent} latent") if part)
            systems.append(LatentKVSystem(f"latentkv {name}".strip(), args.model, latent, max_model_len=length,
                                          kv_cache_memory=budget, quantization=None if weight == "none" else weight))
    if getattr(args, "reference_attention", False):  # the same rows on the PyTorch reference attention
        systems += [LatentKVSystem(f"{s.name} (torch attention)", args.model, s.kv_cache_dtype,
                                   max_model_len=length, kv_cache_memory=budget, quantization=s.engine.args.quantization,
                                   attention_backend="torch") for s in list(systems)]
    if getattr(args, "not_invariant", False):  # the same rows with batch_invariant off: the cost of invariance
        systems += [LatentKVSystem(f"{s.name} (not invariant)", args.model, s.kv_cache_dtype,
                                   max_model_len=length, kv_cache_memory=budget, quantization=s.engine.args.quantization,
                                   attention_backend=s.engine.args.attention_backend, batch_invariant=False)
                    for s in list(systems) if isinstance(s, LatentKVSystem)]
    if getattr(args, "eager", False):  # the same rows through the modules (enforce_eager): what the decode plan brings
        systems += [LatentKVSystem(f"{s.name} (eager)", args.model, s.kv_cache_dtype,
                                   max_model_len=length, kv_cache_memory=budget, quantization=s.engine.args.quantization,
                                   attention_backend=s.engine.args.attention_backend,
                                   batch_invariant=s.engine.args.batch_invariant, enforce_eager=True)
                    for s in list(systems) if isinstance(s, LatentKVSystem) and not s.engine.args.enforce_eager]
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
        if attempt(s, failed, "decode", min(4, args.tokens)) is FAILED:  # warm-up: first-call costs are not decode speed
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


def run(args) -> dict:
    out = Path(args.out)
    failed: dict[str, str] = {}
    systems = build_systems(args, failed)
    vocab = systems[0].engine.cfg.vocab_size
    bandwidth = measure_bandwidth()
    ours = {s.name: s for s in systems if isinstance(s, LatentKVSystem)}
    # bytes one step must read besides the cache, per latentkv row (quantized weights as stored)
    weights = {name: weight_bytes(s.model) for name, s in ours.items()}
    per_token = {name: latent_bytes_per_token(s.engine.cfg, s.engine.args.kv_cache_dtype, dtype_name(s.engine.runner.dtype))
                 for name, s in ours.items()}
    results = []
    live = list(systems)
    for ctx in args.contexts:
        prompts = [torch.randint(3, vocab, (ctx,), generator=torch.Generator().manual_seed(ctx + 7919 * r)).tolist()
                   for r in range(getattr(args, "prefill_repeats", 1) - 1, -1, -1)]  # the last: seed ctx, as before
        prefill, times = measure_context(live, prompts, args, failed)
        results.append(summarize(ctx, times, list(ours), weights, per_token, bandwidth))
        results[-1]["prefill_tok_s"] = prefill
        results[-1]["prefill_prompts"] = len(prompts)
        print(f"context {ctx}: " + ", ".join(f"{n} {v:.2f} tok/s" for n, v in results[-1]["tok_s"].items()), flush=True)
    close_all(systems)
    show(results, systems, list(ours), bandwidth, weights)
    for name, reason in failed.items():
        print(f"{name}: failed (not in the tables from then on): {reason}\n", flush=True)
    plot(results, [s.name for s in systems], out)
    payload = {"model_dtype": dtype_name(systems[0].engine.runner.dtype), "bandwidth_gbs": bandwidth / 1e9, "weight_bytes": weights, "tokens": args.tokens, "repeats": args.repeats,
               "threads": torch.get_num_threads(), "results": results, "failed": failed}
    write_json(out, "decode", payload)
    return payload


def summarize(ctx: int, times: dict, ours: list[str], weights: dict, per_token: dict, bandwidth: float) -> dict:
    """tok_s per system; ratio: the first latentkv row over each system; speedup[ours][baseline] for
    every latentkv row over every baseline; floor_fraction: each latentkv row's share of its
    bandwidth bound (weights + cache bytes it must read per step / measured bandwidth)."""
    tok_s = {name: 1 / median(t) for name, t in times.items()}
    baselines = [n for n in tok_s if n not in ours]
    first = ours[0]
    row = {"context": ctx, "tok_s": tok_s, "ratio": {n: tok_s[first] / v for n, v in tok_s.items()},
           "speedup": {o: {b: tok_s[o] / tok_s[b] for b in baselines} for o in ours}}
    floors = {o: decode_floor_seconds(weights[o], per_token[o], ctx, bandwidth) for o in ours}
    row["floor_s"] = floors[first]
    row["floor_fraction"] = floors[first] * tok_s[first]
    row["floor_fractions"] = {o: floors[o] * tok_s[o] for o in ours}
    return row


def show(results: list[dict], systems: list, ours: list[str], bandwidth: float, weights: dict) -> None:
    names = [s.name for s in systems]
    rows = [{"context": r["context"], **{n: r["tok_s"].get(n) for n in names}} for r in results]
    print(f"model dtype {systems[0].engine.runner.dtype} (dtype auto on this CPU); "
          f"memory bandwidth {bandwidth / 1e9:.1f} GB/s ({torch.get_num_threads()} threads); weights read per step: "
          + ", ".join(f"{n} {w / 2**20:.0f} MiB" for n, w in weights.items()))
    print_table("Batch-1 greedy decode (median tokens/s)", list(rows[0].keys()), rows)
    ratio_rows = []
    for r in results:
        for o in ours:
            ratio_rows.append({"context": r["context"], "latentkv row": o, **{f"x vs {b}": v for b, v in r["speedup"][o].items()},
                               "floor %": 100 * r["floor_fractions"][o]})
    print_table("Speed-up of each latentkv row over each baseline; share of its bandwidth floor",
                list(ratio_rows[0].keys()), ratio_rows)
    # each prompt is new to the system (a prefix-cached one would be free): --prefill-repeats prompts a context
    prefill_rows = [{"context": r["context"], **{n: r["prefill_tok_s"].get(n) for n in names}} for r in results]
    print_table(f"Prefill of the context's prompt (tokens/s, median of {results[0]['prefill_prompts']} prompt(s) each)",
                list(prefill_rows[0].keys()), prefill_rows)
    baselines = [n for n in names if n not in ours]
    if baselines:
        print_table("Prefill speed-up of each latentkv row over each baseline", ["context", "latentkv row"]
                    + [f"x vs {b}" for b in baselines],
                    [{"context": r["context"], "latentkv row": o,
                      **{f"x vs {b}": r["prefill_tok_s"][o] / r["prefill_tok_s"][b]
                         for b in baselines if b in r["prefill_tok_s"]}}
                     for r in results for o in ours])


def plot(results: list[dict], names: list[str], out: Path) -> Path:
    fig, ax = new_figure("Batch-1 decode speed", "context (tokens)", "tokens/s", log_x=True)
    ctx = [r["context"] for r in results]
    for name in names:
        points = [(c, r["tok_s"][name]) for c, r in zip(ctx, results) if name in r["tok_s"]]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    return save_figure(fig, out, "decode")
