"""The decode step and prefill rate of two served folders in one process, their steps alternating (the
machine's drift falls on both alike): N prompts of L random tokens each, greedy, prefill, then STEPS decode
steps of each engine in turn (the median and quartiles). Usage: python speed_ab.py FOLDER_A FOLDER_B N L [STEPS]"""

import os
import statistics
import sys
import time

import torch

from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams

a, b, n, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 40
engines = {}
for folder in (a, b):
    llm = LLM(
        model=folder,
        max_model_len=length + steps + 64,
        max_num_seqs=n,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
    )
    engine = llm.engine
    gen = torch.Generator().manual_seed(1)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(n):
        engine.add_request(f"r{i}", torch.randint(3, 49000, (length,), generator=gen).tolist(), params)
    seqs = [s for i in range(n) for s in engine.requests[f"r{i}"]]
    start = time.perf_counter()
    while not all(s.num_output_tokens >= 1 for s in seqs):
        engine.step()
    engines[folder] = (engine, n * length / (time.perf_counter() - start), [])
for _ in range(2):  # warm
    for engine, _, _ in engines.values():
        engine.step()
for _ in range(steps):
    for engine, _, times in engines.values():
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1e3)
median = {f: statistics.median(times) for f, (_, _, times) in engines.items()}
for f, (_, rate, times) in engines.items():
    q = statistics.quantiles(times, n=4)
    print(
        f"{os.path.basename(f)} {n} x {length}: prefill {rate:.0f} tok/s, "
        f"decode step median {median[f]:.1f} ms (quartiles {q[0]:.1f}-{q[2]:.1f})"
    )
print(f"ratio {median[a] / median[b]:.2f}")
