# A layer's five prompt linears at 2,048 rows: qlinear on AMX (isa 4) vs torch bf16 F.linear (oneDNN), 2 threads
import time, torch, torch.nn.functional as F
from latentkv.kernels import qlinear
m = qlinear.extension()
def t(fn, n):
    fn(); fn(); best = 1e9
    for _ in range(5):
        s = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - s) / n)
    return best
torch.set_num_threads(2)
tot_t = tot_a = 0
for (K, N) in ((576, 1440), (576, 336), (576, 576), (576, 3072), (1536, 576)):
    w = torch.randn(N, K).bfloat16(); p = qlinear.pack_bf16(w)
    x = torch.randn(2048, K).bfloat16()
    tt = t(lambda: F.linear(x, w), 5); ta = t(lambda: m.linear(x, p, 16, N, 4), 5)
    tot_t += tt; tot_a += ta
    print(f"K {K} N {N}: torch {tt*1e3:.2f} ms amx {ta*1e3:.2f} ms ({tt/ta:.2f}x)")
print(f"layer total: torch {tot_t*1e3:.2f} amx {tot_a*1e3:.2f} ({tot_t/tot_a:.2f}x)")
