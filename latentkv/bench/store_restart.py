"""`latentkv bench prefix --store`: the on-disk latent store across a restart.

- TTFT of a request whose L-token prefix was served before a restart: cold (a fresh engine,
  no store: the prefix is prefilled again) against restored (a fresh engine on the store
  the earlier one wrote). A "restart" is a new engine (new block pool and latent caches,
  new store handle) around the already loaded weights, so the timing is the prefix's, not
  the weight loading's.
- Store bytes per token on disk (files / tokens stored) against what the original GQA
  model's cache (when known) and an MHA cache of the same shape would need.
- Output throughput with the store on (write-behind busy) against off, same requests.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from latentkv.cache.accounting import account, gqa_bytes_per_token, latent_bytes_per_token
from latentkv.engine.engine import LLMEngine
from latentkv.facts import dtype_name
from latentkv.store.store import SUFFIX

from ..plots import new_figure, save_figure
from .memory import source_shape
from .prefix import ttft
from .report import median, print_table, write_json
from .systems import LatentKVSystem, cache_budget
from .throughput import make_requests, run_latentkv


def restart(loaded: LatentKVSystem, **changes) -> SimpleNamespace:
    """A fresh engine (empty RAM cache) around the loaded model: a process restart minus
    loading the weights. Quacks like a LatentKVSystem for ttft / run_latentkv."""
    engine = loaded.engine
    args = type(engine.args)(**{**vars(engine.args), **changes})
    return SimpleNamespace(engine=LLMEngine(args, engine.model, engine.tokenizer))


def random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


def measure_ttft(loaded: LatentKVSystem, store: Path, lengths: list[int], repeats: int) -> list[dict]:
    vocab, bs = loaded.engine.cfg.vocab_size, loaded.engine.args.block_size
    gen = torch.Generator().manual_seed(0)
    results = []
    for length in lengths:
        times = {"cold": [], "restored": []}
        hits = []
        for r in range(repeats):
            prefix = random_ids(length, vocab, gen)  # fresh per repeat: nothing cached before
            before = restart(loaded, kv_store=str(store))
            ttft(before, prefix + random_ids(32, vocab, gen))
            before.engine.close()  # flushes the write-behind queue
            second = prefix + random_ids(32, vocab, gen)
            systems = {"cold": restart(loaded), "restored": restart(loaded, kv_store=str(store))}
            for key in ("cold", "restored") if r % 2 == 0 else ("restored", "cold"):  # interleaved
                times[key].append(ttft(systems[key], second))
            hits.append(systems["restored"].engine.stats()["store_hits"] * bs)
            systems["restored"].engine.close()
        cold, restored = median(times["cold"]), median(times["restored"])
        results.append(
            {
                "prefix": length,
                "ttft_cold_s": cold,
                "ttft_restored_s": restored,
                "speedup": cold / restored,
                "restored_tokens": min(hits),
            }
        )
        print(
            f"prefix {length}: TTFT cold {cold:.3f} s, restored from the store {restored:.3f} s "
            f"({cold / restored:.1f}x; {min(hits)} tokens restored)",
            flush=True,
        )
    return results


def store_bytes_per_token(store: Path, block_size: int) -> float:
    files = list(store.glob(f"*/blocks/*/*{SUFFIX}"))
    return sum(f.stat().st_size for f in files) / (len(files) * block_size)


def disk_bytes(loaded: LatentKVSystem, store: Path, source: str | None) -> list[dict]:
    """Bytes per token of the store (the TTFT runs' cache dtype, and an int8 latent written
    here from one 256-token prompt) against the latent in RAM, the original GQA cache and MHA."""
    engine = loaded.engine
    bs, cfg, cache_dtype = engine.args.block_size, engine.cfg, engine.args.kv_cache_dtype
    dtype = dtype_name(engine.model.dtype)
    rows = [
        {
            "cache": f"latentkv store on disk, {cache_dtype} latent",
            "bytes/token": store_bytes_per_token(store / "ttft", bs),
        },
        {
            "cache": f"latentkv latent in RAM, {cache_dtype}",
            "bytes/token": latent_bytes_per_token(cfg, cache_dtype, dtype),
        },
    ]
    if cache_dtype != "int8":
        int8 = restart(loaded, kv_cache_dtype="int8", kv_store=str(store / "int8"))
        ttft(int8, random_ids(256 + 1, cfg.vocab_size, torch.Generator().manual_seed(1)))
        int8.engine.close()
        rows.append(
            {"cache": "latentkv store on disk, int8 latent", "bytes/token": store_bytes_per_token(store / "int8", bs)}
        )
        rows.append(
            {"cache": "latentkv latent in RAM, int8", "bytes/token": latent_bytes_per_token(cfg, "int8", dtype)}
        )
    gqa = source_shape(Path(engine.args.model), cfg) if source else None
    if gqa:
        rows.append(
            {
                "cache": f"original GQA ({gqa[1]} KV heads x {gqa[2]}), {dtype}",
                "bytes/token": gqa_bytes_per_token(*gqa, dtype),
            }
        )
    rows.append(
        {"cache": f"MHA of the same shape, {dtype}", "bytes/token": account(cfg, "auto", dtype).mha_bytes_per_token}
    )
    first = rows[0]["bytes/token"]
    for row in rows:
        row["x store"] = row["bytes/token"] / first
    return rows


def measure_throughput(loaded: LatentKVSystem, store: Path, args) -> dict:
    n = max(args.concurrency)
    runs = {"store off": [], "store on": []}
    vocab = loaded.engine.cfg.vocab_size
    for r in range(args.repeats):
        reqs = make_requests(
            n, vocab, (args.min_prompt, args.max_prompt), (args.min_output, args.max_output), seed=100 + r
        )
        budget = cache_budget(args.model, n * (args.max_prompt + args.max_output + 16))
        systems = {
            key: restart(loaded, kv_cache_memory=budget, **extra)
            for key, extra in (("store off", {}), ("store on", {"kv_store": str(store)}))
        }
        for key in ("store off", "store on") if r % 2 == 0 else ("store on", "store off"):
            runs[key].append(run_latentkv(systems[key], reqs)["tok_s"])
        drops = systems["store on"].engine.stats()["store_write_drops"]
        systems["store on"].engine.close()
    off, on = median(runs["store off"]), median(runs["store on"])
    print(f"{n} concurrent requests: {off:.1f} tok/s store off, {on:.1f} tok/s store on ({on / off:.3f}x)", flush=True)
    return {
        "requests": n,
        "tok_s_store_off": off,
        "tok_s_store_on": on,
        "on_vs_off": on / off,
        "write_drops_last": drops,
    }


def run(args) -> dict:
    out = Path(args.out)
    longest = max(max(args.prefixes) + 64, args.max_prompt + args.max_output + 16)
    loaded = LatentKVSystem(
        "latentkv",
        args.model,
        max_model_len=longest,
        kv_cache_memory=cache_budget(args.model, 4 * longest),
        max_num_seqs=max(args.concurrency),
    )
    store = Path(args.store_dir) if args.store_dir else Path(tempfile.mkdtemp(prefix="latentkv-bench-store-"))
    try:
        ttfts = measure_ttft(loaded, store / "ttft", args.prefixes, args.repeats)
        disk = disk_bytes(loaded, store, args.source)
        throughput = measure_throughput(loaded, store / "throughput", args)
    finally:
        if not args.store_dir:
            shutil.rmtree(store, ignore_errors=True)
    print_table(
        "Time to first token after a restart: cold vs restored from the store (median)",
        ["prefix", "ttft_cold_s", "ttft_restored_s", "speedup", "restored_tokens"],
        ttfts,
    )
    print_table("Cache bytes per token", ["cache", "bytes/token", "x store"], disk)
    print_table("Throughput, write-behind on vs off", list(throughput), [throughput])
    fig, ax = new_figure("TTFT after a restart", "shared prefix (tokens)", "time to first token (s)", log_x=True)
    ax.plot([r["prefix"] for r in ttfts], [r["ttft_cold_s"] for r in ttfts], marker="o", label="cold (no store)")
    ax.plot(
        [r["prefix"] for r in ttfts], [r["ttft_restored_s"] for r in ttfts], marker="o", label="restored from the store"
    )
    save_figure(fig, out, "prefix-store")
    payload = {
        "ttft": ttfts,
        "bytes_per_token": disk,
        "throughput": throughput,
        "repeats": args.repeats,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(out, "prefix-store", payload)
    return payload
