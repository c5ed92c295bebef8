"""Profile TTFT of a 4K prefix restored from the store after a restart (default conversion)."""
import cProfile, pstats, sys, tempfile, time, glob
import torch
from latentkv.bench.systems import LatentKVSystem, cache_budget
from latentkv.bench.store_restart import restart, random_ids
from latentkv.bench.prefix import ttft

model = sorted(glob.glob("/root/.cache/latentkv/converted/*"))[0]
L = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
torch.set_num_threads(2)
loaded = LatentKVSystem("x", model, max_model_len=L + 128, enable_prefix_caching=True, kv_cache_memory=cache_budget(model, 4 * (L + 128)))
store = tempfile.mkdtemp()
gen = torch.Generator().manual_seed(0)
vocab = loaded.engine.cfg.vocab_size
for rep in range(2):
    prefix = random_ids(L, vocab, gen)
    before = restart(loaded, kv_store=store)
    t = ttft(before, prefix + random_ids(32, vocab, gen)); before.engine.close()
    second = prefix + random_ids(32, vocab, gen)
    cold = restart(loaded)
    tc = ttft(cold, second)
    r = restart(loaded, kv_store=store)
    prof = cProfile.Profile()
    t0 = time.perf_counter(); prof.enable(); tr = ttft(r, second); prof.disable()
    print(f"rep {rep}: first {t:.3f}s cold {tc:.3f}s restored {tr:.3f}s hits {r.engine.stats()['store_hits']}")
    r.engine.close()
pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
