"""`latentkv bench step`: the decode step at N sequences against the time its reads need.

For each batch size N: N prompts of `--context` tokens are prefilled, then the engine's decode
steps (all N sequences, one token each, greedy) are timed one by one. A step must read the weights
its tokens use and each sequence's cache: the dense weights, and of each MoE layer's routed experts
only those the step's tokens route to (counted on a step of this run: 8 tokens of DeepSeek-V2-Lite
touch ~35 of 64 a layer, so batch 8 cannot be 8x batch 1). floor = those bytes / the measured
bandwidth; `step / floor` says how far a step is from the memory's limit, `x batch 1` how the step
scales, and `ceiling x batch 1` what the floor allows. The bandwidth is measured just before and just
after each batch's timed steps (one reading between two batches serves both), and that batch's floor
takes their mean: on a shared machine (a cloud VM) the copy bandwidth moved between 26 and 59 GB/s
within one hour, within one run too (a 2-vCPU Zen 4), so one reading at the start could misstate a
later batch's floor by as much. `--rounds R` measures every
batch size R times in turn and reports medians, `x batch 1` taken within each round (a batch 1 timed in a
slow minute once made batch 8 read 2.7x batch 1, where two other runs read 1.6-1.8x).

One engine serves every batch size (the weights are loaded once); the peak resident memory of the
process is reported with it (the cache as asked, or the engine's default), less the bandwidth probes'
own buffers where the system can restart the peak (Linux)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams

from ..cache.accounting import latent_bytes_per_token
from ..facts import dtype_name
from ..plots import new_figure, save_figure
from ..sizes import peak_rss, reset_peak_rss
from .bandwidth import measure_bandwidth, step_weight_bytes
from .report import median, print_table, write_json

WARM_STEPS = 2  # decode steps before timing (the first may build the plan's buffers)


def run(args) -> dict:
    out = Path(args.out)
    longest = args.context + WARM_STEPS + args.steps + 8
    llm = LLM(
        model=args.model,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=None if args.weights == "none" else args.weights,
        kv_cache_memory=args.kv_cache_memory,
        max_model_len=longest + 16,
        max_num_seqs=max(args.batches),
        max_num_batched_tokens=max(2048, args.context),
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
    )
    engine = llm.engine
    model = engine.runner.model
    cfg = engine.cfg
    per_token = latent_bytes_per_token(cfg, engine.args.kv_cache_dtype, dtype_name(engine.runner.dtype))
    peaks: list[int] = []
    probes = [probe_bandwidth(peaks)]  # one reading between two batches is the after of one, the before of the next
    rounds = []
    for i in range(args.rounds):  # every batch size once a round, so that the machine's drift reaches all alike
        points = []
        for n in args.batches:
            times, touched = measure_batch(engine, n, args)
            probes.append(probe_bandwidth(peaks))
            points.append(point(model, n, times, touched, probes[-2], probes[-1], args, per_token))
            last = points[-1]
            print(
                f"round {i + 1}, batch {n}: step {last['step_ms']:.1f} ms, floor {last['floor_ms']:.1f} ms", flush=True
            )
        rounds.append(points)
    results = [
        combine([points[j] for points in rounds], [points[0] for points in rounds]) for j in range(len(args.batches))
    ]
    payload = {
        "model": str(args.model),
        "weights": args.weights,
        "kv_cache_dtype": engine.args.kv_cache_dtype,
        "model_dtype": dtype_name(engine.runner.dtype),
        "context": args.context,
        "steps": args.steps,
        "rounds": args.rounds,
        "bandwidth_gbs": median(probes) / 1e9,
        "bandwidth_range_gbs": [min(probes) / 1e9, max(probes) / 1e9],
        "threads": torch.get_num_threads(),
        "peak_rss_gib": max(peaks + [peak_rss()]) / 2**30,
        "results": results,
    }
    show(payload)
    plot(payload, out)
    write_json(out, "step", payload)
    return payload


def point(
    model, n: int, times: list[float], touched: list[int], before: float, after: float, args, per_token: int
) -> dict:
    """One batch size measured once: its step (the median of the timed steps) against its floor, the bytes
    it reads over the mean of the bandwidth probed just before and just after it."""
    bandwidth = (before + after) / 2
    context = args.context + WARM_STEPS + args.steps / 2  # the mean context of a timed step
    weights = step_weight_bytes(model, touched)
    cache = n * context * per_token
    floor = (weights + cache) / bandwidth
    step = median(times)
    return {
        "batch": n,
        "step_ms": 1e3 * step,
        "tok_s": n / step,
        "experts_touched": touched,
        "weight_bytes": weights,
        "cache_bytes": cache,
        "bandwidth_gbs": bandwidth / 1e9,
        "bandwidth_probes_gbs": [before / 1e9, after / 1e9],
        "floor_ms": 1e3 * floor,
        "step_over_floor": step / floor,
    }


def combine(points: list[dict], firsts: list[dict]) -> dict:
    """One batch size over the rounds (points, and the first batch size's points of the same rounds): each
    figure the median over rounds; `x first` and `ceiling x first` taken within a round, then the median."""
    last = points[-1]
    out = {
        key: median([p[key] for p in points])
        for key in ("step_ms", "floor_ms", "step_over_floor", "bandwidth_gbs", "weight_bytes", "cache_bytes")
    }
    out["tok_s"] = last["batch"] / out["step_ms"] * 1e3
    out["x_first"] = median([p["tok_s"] / f["tok_s"] for p, f in zip(points, firsts)])
    out["ceiling_x_first"] = median(
        [(p["batch"] / p["floor_ms"]) / (f["batch"] / f["floor_ms"]) for p, f in zip(points, firsts)]
    )
    out["bandwidth_probes_gbs"] = [g for p in points for g in p["bandwidth_probes_gbs"]]
    out["round_step_ms"] = [p["step_ms"] for p in points]
    return {"batch": last["batch"], "experts_touched": last["experts_touched"], **out}


def probe_bandwidth(peaks: list[int]) -> float:
    """The copy bandwidth now (bytes/s), measure_bandwidth's buffers left out of the peak RSS reported: the peak
    so far goes to `peaks` first and restarts after (a probe between batches sits on top of whatever heap
    the engine kept from its last step: the engine's peak, not the bench's, is what the run reports)."""
    peaks.append(peak_rss())
    bandwidth = measure_bandwidth()
    reset_peak_rss()
    return bandwidth


def measure_batch(engine, n: int, args) -> tuple[list[float], list[int]]:
    """N sequences prefilled, then `args.steps` all-decode steps timed -> (seconds per step, routed
    experts a decode step of them touches per MoE layer)."""
    vocab = engine.cfg.vocab_size
    gen = torch.Generator().manual_seed(args.context + 7919 * n)
    params = SamplingParams(temperature=0, max_tokens=WARM_STEPS + args.steps + 8, ignore_eos=True)
    ids = [f"step-{n}-{i}" for i in range(n)]
    for rid in ids:
        engine.add_request(rid, torch.randint(3, vocab, (args.context,), generator=gen).tolist(), params)
    seqs = [seq for rid in ids for seq in engine.requests[rid]]
    while not all(seq.num_output_tokens >= 1 for seq in seqs):  # the prompts, in chunks
        engine.step()
    for _ in range(WARM_STEPS):
        engine.step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    touched = count_experts(engine)
    for rid in ids:
        engine.abort_request(rid)
    return times, touched


def count_experts(engine) -> list[int]:
    """Distinct routed experts of each MoE layer over one decode step (run through the modules, whose
    router the decode plan shares); [] for a dense model."""
    gates = [m.gate for m in engine.runner.model.modules() if hasattr(m, "gate") and hasattr(m, "experts")]
    if not gates:
        return []
    seen: dict[int, int] = {}

    def record(module, _inputs, output):
        seen[id(module)] = int(output[1].unique().numel())

    hooks = [g.register_forward_hook(record) for g in gates]
    plan, engine.runner.plan = engine.runner.plan, None
    try:
        engine.step()
    finally:
        engine.runner.plan = plan
        for h in hooks:
            h.remove()
    return [seen[id(g)] for g in gates]


def show(payload: dict) -> None:
    low, high = payload["bandwidth_range_gbs"]
    print(
        f"{payload['model']}: weights {payload['weights']}, cache {payload['kv_cache_dtype']}, model dtype "
        f"{payload['model_dtype']}; context {payload['context']}; {payload['rounds']} round(s); memory bandwidth "
        f"{low:.1f}-{high:.1f} GB/s "
        f"(copy, before and after each batch; {payload['threads']} threads); peak RSS {payload['peak_rss_gib']:.2f} GiB"
    )
    rows = [
        {
            "batch": r["batch"],
            "step ms": r["step_ms"],
            "tok/s": r["tok_s"],
            "x first": r["x_first"],
            "experts/layer": sum(r["experts_touched"]) / len(r["experts_touched"]) if r["experts_touched"] else None,
            "weights MiB": r["weight_bytes"] / 2**20,
            "GB/s": r["bandwidth_gbs"],
            "floor ms": r["floor_ms"],
            "step / floor": r["step_over_floor"],
            "ceiling x first": r["ceiling_x_first"],
        }
        for r in payload["results"]
    ]
    print_table(
        "Decode step by batch (median of the timed steps); floor: the bytes the step reads / the batch's bandwidth",
        list(rows[0]),
        rows,
    )


def plot(payload: dict, out: Path) -> None:
    results = payload["results"]
    fig, ax = new_figure("Decode tokens/s by batch, and the bandwidth ceiling", "sequences in the batch", "tokens/s")
    batches = [r["batch"] for r in results]
    ax.plot(batches, [r["tok_s"] for r in results], marker="o", label="latentkv")
    ax.plot(batches, [1e3 * r["batch"] / r["floor_ms"] for r in results], linestyle="--", label="bandwidth ceiling")
    save_figure(fig, out, "step")
