"""`latentkv bench throughput`: N concurrent requests of mixed, seeded prompt and output
lengths; total output tokens/s, TTFT and inter-token latency percentiles; against
transformers' batched `generate` on the original model at the same batch sizes (in its own
process: if it crashes, the reason is recorded and the bench goes on without it)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from latentkv.sampling_params import SamplingParams

from ..plots import new_figure, save_figure
from .isolated import FAILED, attempt, close_all
from .report import median, percentile, print_table, write_json
from .systems import LatentKVSystem, cache_budget, load_hf, transformers_baseline


def make_requests(n: int, vocab: int, prompt_range, output_range, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    reqs = []
    for _ in range(n):
        plen, olen = rng.randint(*prompt_range), rng.randint(*output_range)
        reqs.append((torch.randint(3, vocab, (plen,), generator=gen).tolist(), olen))
    return reqs


def run_latentkv(system: LatentKVSystem, reqs) -> dict:
    engine = system.engine
    start = time.perf_counter()
    stamps: dict[str, list[float]] = {}
    for i, (prompt, olen) in enumerate(reqs):
        rid = f"tp-{id(reqs)}-{i}-{start}"
        engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=olen, ignore_eos=True))
        stamps[rid] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter()
            s = stamps[out.request_id]
            s += [now] * (len(out.outputs[0].token_ids) - len(s))
    wall = time.perf_counter() - start
    ttft = [s[0] - start for s in stamps.values()]
    itl = [b - a for s in stamps.values() for a, b in zip(s, s[1:])]
    tokens = sum(len(s) for s in stamps.values())
    return {
        "tok_s": tokens / wall,
        "ttft_p50": median(ttft),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": median(itl),
        "itl_p99": percentile(itl, 99),
        "tokens": tokens,
        "wall_s": wall,
    }


@torch.inference_mode()
def run_transformers(model, reqs, pad_id: int) -> dict:
    """One left-padded batched greedy `generate`; useful tokens = what each request asked."""
    width = max(len(p) for p, _ in reqs)
    ids = torch.full((len(reqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(reqs):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    longest = max(o for _, o in reqs)
    start = time.perf_counter()
    model.generate(
        ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False, pad_token_id=pad_id
    )
    wall = time.perf_counter() - start
    tokens = sum(o for _, o in reqs)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall}


class TransformersGenerate:
    """transformers' batched generate on the original model (built in its own process by bench/isolated.py)."""

    def __init__(self, name: str, source: str):
        self.name = name
        self.model = load_hf(source)

    def run(self, reqs) -> dict:
        return run_transformers(self.model, reqs, pad_id=0)


LOOSE = "latentkv not invariant"


def run(args) -> dict:
    out = Path(args.out)
    longest = args.max_prompt + args.max_output + 16
    opts = dict(
        max_model_len=longest,
        max_num_seqs=max(args.concurrency),
        enable_prefix_caching=False,
        kv_cache_memory=cache_budget(args.model, max(args.concurrency) * longest),
    )
    opts.update(quantization=getattr(args, "quantization", None))
    latent = getattr(args, "kv_cache_dtype", None) or "auto"
    system = LatentKVSystem("latentkv", args.model, latent, **opts)
    # batch_invariant off, interleaved with the default: what invariance costs
    loose = (
        LatentKVSystem(LOOSE, args.model, latent, batch_invariant=False, **opts)
        if getattr(args, "not_invariant", False)
        else None
    )
    vocab = system.engine.cfg.vocab_size
    failed: dict[str, str] = {}
    baseline = (
        transformers_baseline("transformers", args.source, failed, "latentkv.bench.throughput:TransformersGenerate")
        if args.source
        else []
    )
    hf = baseline[0] if baseline else None
    results = []
    for n in args.concurrency:
        reqs = make_requests(n, vocab, (args.min_prompt, args.max_prompt), (args.min_output, args.max_output), seed=n)
        runs = {"latentkv": [], LOOSE: [], "transformers": []}
        for _ in range(args.repeats):  # interleaved
            runs["latentkv"].append(run_latentkv(system, reqs))
            if loose is not None:
                runs[LOOSE].append(run_latentkv(loose, reqs))
            if hf is not None:
                measured = attempt(hf, failed, "call", "run", reqs)
                if measured is FAILED:  # recorded in `failed`: the later sizes run without it
                    hf = None
                else:
                    runs["transformers"].append(measured)
        results.append(summarize(n, runs))
        done = results[-1]
        print(
            f"{n} concurrent: latentkv {done['latentkv']['tok_s']:.1f} tok/s"
            + (f", transformers {done['transformers']['tok_s']:.1f} tok/s" if "transformers" in done else ""),
            flush=True,
        )
    close_all(baseline)
    base = next(r for r in results if r["concurrency"] == min(args.concurrency))["latentkv"]["tok_s"]
    for r in results:
        r["x_vs_own_batch1"] = r["latentkv"]["tok_s"] / base
    show(results)
    plot(results, out)
    for name, reason in failed.items():
        print(f"{name}: failed: {reason}\n", flush=True)
    payload = {
        "results": results,
        "repeats": args.repeats,
        "failed": failed,
        "latentkv": {"quantization": system.engine.args.quantization, "kv_cache_dtype": latent},
    }
    write_json(out, "throughput", payload)
    return payload


def summarize(n: int, runs: dict) -> dict:
    row = {"concurrency": n}
    for name, rs in runs.items():
        if rs:
            row[name] = {k: median([r[k] for r in rs]) for k in rs[0]}
    return row


def show(results: list[dict]) -> None:
    rows = []
    for r in results:
        ours, hf, loose = r["latentkv"], r.get("transformers"), r.get(LOOSE)
        rows.append(
            {
                "requests": r["concurrency"],
                "latentkv tok/s": ours["tok_s"],
                "x own batch-1": r["x_vs_own_batch1"],
                "transformers tok/s": hf["tok_s"] if hf else None,
                "x vs transformers": ours["tok_s"] / hf["tok_s"] if hf else None,
                "TTFT p50 s": ours["ttft_p50"],
                "TTFT p99 s": ours["ttft_p99"],
                "ITL p50 ms": 1e3 * ours["itl_p50"],
                "ITL p99 ms": 1e3 * ours["itl_p99"],
            }
        )
        if loose:  # invariant tok/s over not-invariant tok/s (< 1: what invariance costs)
            rows[-1].update(
                {
                    "not invariant tok/s": loose["tok_s"],
                    "x invariant / not": ours["tok_s"] / loose["tok_s"],
                    "TTFT p50 s not inv.": loose["ttft_p50"],
                }
            )
    print_table("Concurrent requests (medians over interleaved repeats)", list(rows[0].keys()), rows)


def plot(results: list[dict], out: Path) -> Path:
    fig, ax = new_figure("Total output throughput", "concurrent requests", "output tokens/s", log_x=True)
    xs = [r["concurrency"] for r in results]
    ax.plot(xs, [r["latentkv"]["tok_s"] for r in results], marker="o", label="latentkv")
    if all("transformers" in r for r in results):
        ax.plot(xs, [r["transformers"]["tok_s"] for r in results], marker="o", label="transformers generate")
    return save_figure(fig, out, "throughput")
