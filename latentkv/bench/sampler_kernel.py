"""`latentkv bench kernel --sampler`: one decode step's sampling alone — the engine's `sample` over a
batch of logits rows, the native kernel (kernels/sample.py) against the same function on its PyTorch
reference ops (a stable full sort for top-k / top-p, softmax, cumsum; the same uniforms, so the same
tokens), interleaved in one run: ms per step by vocabulary and sampling settings.

The logits are LM-shaped rather than Gaussian: a Zipf slope over a random permutation of the
vocabulary plus noise (l = -1.1 ln rank + 0.5 N(0, 1)), so top-p's nucleus holds tens to hundreds of
tokens as a chat model's does. Each step's rows are sequences with 256 prompt and 64 output tokens
(what the penalties read).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import cpu
from ..engine.sampler import sample
from ..engine.sequence import Sequence
from ..kernels import sample as sample_kernel
from ..sampling_params import SamplingParams
from .report import median, print_table, write_json

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "client default (T 1.0)": dict(temperature=1.0),
    "chat (T 0.7, top_p 0.9)": dict(temperature=0.7, top_p=0.9),
    "top_k 50, top_p 0.95, min_p 0.05": dict(temperature=0.8, top_k=50, top_p=0.95, min_p=0.05),
    "seeded T 1.0": dict(temperature=1.0, seed=0),
    "penalties + logprobs 5": dict(
        temperature=1.0, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.2, logprobs=5
    ),
}
VOCABS = (49152, 129280)  # SmolLM2, DeepSeek-V3


def lm_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rank = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(rows)]).float() + 1
    return -1.1 * rank.log() + 0.5 * torch.randn(rows, vocab, generator=gen)


def batch(rows: int, vocab: int, params: dict) -> list[Sequence]:
    gen = torch.Generator().manual_seed(1)
    seqs = []
    for i in range(rows):
        p = SamplingParams(**{**params, "seed": i} if "seed" in params else params)
        s = Sequence(f"r{i}", torch.randint(0, vocab, (256,), generator=gen).tolist(), p)
        for t in torch.randint(0, vocab, (64,), generator=gen).tolist():
            s.append_token(t)
        seqs.append(s)
    return seqs


def timed(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def run(args) -> dict:
    threads = torch.get_num_threads()
    isa = sample_kernel.EXT.choose() if sample_kernel.available() else None
    print(
        f"{threads} threads; sampler kernel: " + (isa or f"unavailable ({sample_kernel.unavailable_reason()})"),
        flush=True,
    )
    if isa is None:
        raise SystemExit("latentkv bench kernel --sampler: the native sampler does not run here")
    native_state = dict(sample_kernel.EXT.state)
    reference_state = {**native_state, "module": None, "reason": "the reference ops (bench)"}
    rows_out = []
    jobs = [(v, n, name) for v in args.vocabs for n in args.batches for name in SETTINGS]
    for vocab, rows, name in tqdm(jobs, desc="sampler", unit="setting"):
        logits = lm_logits(rows, vocab, seed=vocab + rows)
        seqs = batch(rows, vocab, SETTINGS[name])
        gen = torch.Generator().manual_seed(0)
        times = {"native": [], "reference": []}
        for _ in range(args.repeats):  # interleaved
            for system, state in (("native", native_state), ("reference", reference_state)):
                sample_kernel.EXT.state = state
                sample(logits, seqs, [], gen)  # warm
                times[system].append(timed(lambda: sample(logits, seqs, [], gen), args.calls))
        sample_kernel.EXT.state = native_state
        row = {
            "vocab": vocab,
            "rows": rows,
            "settings": name,
            "native ms": median(times["native"]) * 1e3,
            "reference ms": median(times["reference"]) * 1e3,
        }
        row["speed-up"] = row["reference ms"] / row["native ms"]
        rows_out.append(row)
    print_table(
        f"Sampling one step (engine/sampler.py sample; median of {args.repeats} x {args.calls} calls, "
        f"{threads} threads)",
        list(rows_out[0].keys()),
        rows_out,
    )
    payload = {"cpu_flags": cpu.features(), "isa": isa, "threads": threads, "results": rows_out}
    write_json(Path(args.out), "kernel-sampler", payload)
    return payload
