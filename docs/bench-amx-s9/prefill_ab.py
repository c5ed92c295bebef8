# A/B of a long prefill through LLM (the cached default conversion): python prefill_ab.py 4096
import sys, time, torch
from latentkv import LLM, SamplingParams
from latentkv.user_cache import cache_root
path = str(sorted((cache_root() / "converted").glob("*/"))[0])  # the default conversion (its -stock576 / -original-hf twins sort after it)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
llm = LLM(path, max_model_len=n + 64)
g = torch.Generator().manual_seed(0)
sp = SamplingParams(max_tokens=1, temperature=0)
for rep in range(3):
    ids = torch.randint(100, 40000, (n,), generator=g).tolist()
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
    dt = time.perf_counter() - t
    print(f"prefill {n}: {dt:.3f} s = {n/dt:.0f} tok/s", flush=True)
if len(sys.argv) > 2:
    from torch.profiler import profile
    ids = torch.randint(100, 40000, (n,), generator=g).tolist()
    with profile() as prof:
        llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
