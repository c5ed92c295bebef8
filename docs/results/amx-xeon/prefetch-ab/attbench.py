"""One call of the native paged MLA decode (kernels/attention.mla_decode) on one thread, cycling through as
many random caches (layers) as fill about 1 GB, for as many seconds as given: the time a call.

    python attbench.py BATCH CONTEXT HEADS RANK ROPE [CACHE_DTYPE [SECONDS]]   # CACHE_DTYPE: auto (bf16 here) | int8

An A/B of two builds runs it from each checkout in turn (run.sh).
"""
import sys, time, torch
from latentkv.bench.kernel import random_cache
from latentkv.attention.metadata import build_metadata
from latentkv.kernels import attention as ak
torch.set_num_threads(1)
B, C, H, R, P = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dt = sys.argv[6] if len(sys.argv) > 6 else "int8"
secs = float(sys.argv[7]) if len(sys.argv) > 7 else 5
layers = max(1, int(1.0e9 // (B * C * (R + P + 8))))
q = (torch.randn(B, H, R + P) * (R + P) ** -0.5).bfloat16()
runs = []
for l in range(layers):
    cache, tables = random_cache(B, C, R, P, torch.bfloat16, dt, seed=l)
    meta, _ = build_metadata([1] * B, [C] * B, tables, 16)
    runs.append((cache, meta))
def call(i):
    cache, meta = runs[i % layers]
    return ak.mla_decode(q, cache, meta.block_tables, meta.context_lens, heads=H, threads=1)
for i in range(layers): call(i)
n = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < secs:
    call(n); n += 1
dt_ = (time.perf_counter() - t0) / n
print(f"B={B} C={C} H={H} R={R}+{P} {dt}: {dt_*1e3:.2f} ms/call, {dt_/(B*C)*1e9:.1f} ns/token-row, layers {layers}")
