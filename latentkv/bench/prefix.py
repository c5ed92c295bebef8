"""`latentkv bench prefix`: time to first token of a request that shares a long prefix
with an earlier one, prefix cache on against off."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from latentkv.sampling_params import SamplingParams

from ..plots import new_figure, save_figure
from .report import median, print_table, write_json
from .systems import LatentKVSystem, cache_budget


def ttft(system: LatentKVSystem, prompt: list[int]) -> float:
    engine = system.engine
    rid = f"prefix-{time.perf_counter_ns()}"
    start = time.perf_counter()
    engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def run(args) -> dict:
    out = Path(args.out)
    longest = max(args.prefixes) + 64
    budget = cache_budget(args.model, 4 * longest)
    systems = {
        "on": LatentKVSystem(
            "prefix cache on", args.model, max_model_len=longest, enable_prefix_caching=True, kv_cache_memory=budget
        ),
        "off": LatentKVSystem(
            "prefix cache off", args.model, max_model_len=longest, enable_prefix_caching=False, kv_cache_memory=budget
        ),
    }
    vocab = systems["on"].engine.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    results = []
    for length in args.prefixes:
        times = {"on": [], "off": []}
        for _ in range(args.repeats):
            prefix = torch.randint(3, vocab, (length,), generator=gen).tolist()  # fresh per repeat
            first = prefix + torch.randint(3, vocab, (32,), generator=gen).tolist()
            second = prefix + torch.randint(3, vocab, (32,), generator=gen).tolist()
            for key in ("on", "off"):  # interleaved
                ttft(systems[key], first)  # the earlier request
                times[key].append(ttft(systems[key], second))
        on, off = median(times["on"]), median(times["off"])
        results.append(
            {
                "prefix": length,
                "ttft_on_s": on,
                "ttft_off_s": off,
                "speedup": off / on,
                "hits": systems["on"].engine.stats().get("prefix_hits"),
            }
        )
        print(f"prefix {length}: TTFT on {on:.3f} s, off {off:.3f} s ({off / on:.1f}x)", flush=True)
    print_table(
        "Time to first token with a shared prefix (median)", ["prefix", "ttft_on_s", "ttft_off_s", "speedup"], results
    )
    fig, ax = new_figure("TTFT with a shared prefix", "shared prefix (tokens)", "time to first token (s)", log_x=True)
    ax.plot([r["prefix"] for r in results], [r["ttft_off_s"] for r in results], marker="o", label="prefix cache off")
    ax.plot([r["prefix"] for r in results], [r["ttft_on_s"] for r in results], marker="o", label="prefix cache on")
    save_figure(fig, out, "prefix")
    payload = {"results": results, "repeats": args.repeats}
    write_json(out, "prefix", payload)
    return payload
