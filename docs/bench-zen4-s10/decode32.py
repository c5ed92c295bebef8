import time, glob, sys
import torch
from latentkv import LLM, SamplingParams
model = sorted(glob.glob("/root/.cache/latentkv/converted/*"))[0]
B = int(sys.argv[1]) if len(sys.argv) > 1 else 32
extra = dict(a.split("=") for a in sys.argv[2:])
extra = {k: (v == "1" if v in ("0", "1") else v) for k, v in extra.items()}
llm = LLM(model=model, max_model_len=1024, skip_tokenizer_init=True, max_num_seqs=64, threads=2, enable_prefix_caching=False, **extra)
eng = llm.engine
vocab = eng.cfg.vocab_size
g = torch.Generator().manual_seed(0)
for i in range(B):
    eng.add_request(f"r{i}", torch.randint(3, vocab, (256,), generator=g).tolist(), SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
times = []
while eng.has_unfinished_requests():
    t = time.perf_counter(); eng.step(); times.append(time.perf_counter() - t)
dec = sorted(times[-40:])
print([round(x*1e3) for x in times]); print(f"B={B} {extra}: steps {len(times)}, decode step median {dec[len(dec)//2]*1e3:.1f} ms, min {dec[0]*1e3:.1f} ms; first steps {[round(x,2) for x in times[:6]]}")
