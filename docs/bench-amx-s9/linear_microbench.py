# Run: python linear_microbench.py (1 thread then 2; isa 3 = avx512_bf16 vdpbf16ps, 4 = amx)
"""qlinear bf16 (kind 16) per ISA vs torch's bf16 F.linear (oneDNN), shapes of the SmolLM2 conversion."""
import sys, time, torch, torch.nn.functional as F
from latentkv.kernels import qlinear
m = qlinear.extension()
def t(fn, n):
    fn(); fn()
    best = 1e9
    for _ in range(3):
        s = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - s) / n)
    return best
for threads in (1, 2):
    torch.set_num_threads(threads)
    for (K, N) in ((576, 3072), (1536, 576), (576, 1152)):
        w = torch.randn(N, K).bfloat16(); p = qlinear.pack_bf16(w)
        for M in (1, 16, 512, 2048):
            x = torch.randn(M, K).bfloat16()
            n = max(2, int(2e8 / (M * K * N)))
            tt = t(lambda: F.linear(x, w), n)
            row = [f"thr {threads} K {K} N {N} M {M:5d}: torch {tt*1e3:8.3f} ms"]
            for isa in (3, 4):
                ti = t(lambda: m.linear(x, p, 16, N, isa), n)
                row.append(f"isa{isa} {ti*1e3:8.3f} ms ({tt/ti:5.2f}x torch)")
            print("  ".join(row), flush=True)
