"""Prefill rate and decode step of a served folder: N prompts of L random tokens, greedy, then the
median of 8 decode steps (docs/results/tcserve/speed.txt). Usage: python speed.py FOLDER N L"""

import os
import sys
import time

import torch

from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams

folder, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = LLM(
    model=folder, max_model_len=length + 64, max_num_seqs=n, max_num_batched_tokens=2048, enable_prefix_caching=False
)
engine = llm.engine
gen = torch.Generator().manual_seed(1)
params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
for i in range(n):
    engine.add_request(f"r{i}", torch.randint(3, 49000, (length,), generator=gen).tolist(), params)
seqs = [s for i in range(n) for s in engine.requests[f"r{i}"]]
start = time.perf_counter()
while not all(s.num_output_tokens >= 1 for s in seqs):
    engine.step()
prefill = time.perf_counter() - start
steps = []
for _ in range(8):
    start = time.perf_counter()
    engine.step()
    steps.append(time.perf_counter() - start)
steps.sort()
print(
    f"{os.path.basename(folder)} {n} x {length}: prefill {prefill:.1f} s ({n * length / prefill:.0f} tok/s), "
    f"decode step median {steps[4] * 1e3:.1f} ms",
    flush=True,
)
