import time, torch
from latentkv.model.quant import W4A8Linear, FixedOrderLinear, W8A8Linear
torch.manual_seed(0)
from latentkv.sizes import keep_freed_memory; keep_freed_memory()
def bench(mod, x, n=20):
    mod(x)
    t = time.perf_counter()
    for _ in range(n): mod(x)
    return (time.perf_counter() - t) / n * 1e3
for (N, K) in [(1024, 1024), (1024, 5632), (11264, 1024)]:
    w = torch.randn(N, K) * 0.02
    for M in [1, 16, 64, 256, 1024]:
        x = torch.randn(M, K).to(torch.bfloat16)
        row = []
        for cls in (FixedOrderLinear, W4A8Linear, W8A8Linear):
            m = cls.from_weight(w.to(torch.bfloat16))
            row.append(bench(m, x))
        print(f"N{N} K{K} M{M}: bf16 {row[0]:.3f}  w4a8 {row[1]:.3f}  w8a8 {row[2]:.3f} ms  w4a8/bf16 {row[1]/row[0]:.2f}", flush=True)
