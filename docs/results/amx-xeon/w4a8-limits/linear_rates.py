"""bf16 (AMX bf16 tiles) against w4a8 (AMX int8 tiles at these rows) linears of V3-mini's shapes: one
thread, CPU time per call (steadier than wall time on a shared machine), GMAC/s.

    python docs/results/amx-xeon/w4a8-limits/linear_rates.py
"""

import time

import torch

from latentkv.kernels import qlinear as q

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
for n, k in [(3072, 768), (11264, 1024)]:  # q_b; a dense layer's gate_up
    for kind in (16, 104):
        w = q.probe_weight(kind, n, k, gen)
        for m in (32, 256):
            x = torch.randn(m, k).to(torch.bfloat16)
            f = (lambda: q.linear(x, w, 16, n)) if kind == 16 else (lambda: q.dot_linear(x, w, 4, n))
            for _ in range(3):
                f()
            best = 1e9
            for _ in range(7):
                t = time.process_time()
                f(), f(), f()
                best = min(best, (time.process_time() - t) / 3)
            name = "bf16" if kind == 16 else "w4a8"
            print(f"{name} N={n} K={k} M={m}: {best * 1e3:.3f} ms, {m * n * k / best / 1e9:.0f} GMAC/s", flush=True)
