import sys, time, torch
from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams
w = sys.argv[1]; kv = sys.argv[2]; prof = len(sys.argv) > 3
llm = LLM(model="/work/v3mini", kv_cache_dtype=kv, quantization=None if w == "none" else w,
          max_model_len=600, max_num_seqs=32, max_num_batched_tokens=2048,
          enable_prefix_caching=False, skip_tokenizer_init=True)
g = torch.Generator().manual_seed(0)
def prompts(n, seed):
    g.manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(100, 120000, (256,), generator=g).tolist()} for _ in range(n)]
sp = SamplingParams(max_tokens=1, temperature=0)
llm.generate(prompts(8, 1), sp, use_tqdm=False)
for r in range(2):
    t = time.perf_counter(); llm.generate(prompts(16, 2 + r), sp, use_tqdm=False)
    dt = time.perf_counter() - t
    print(f"{w}/{kv}: 16 x 256 prefill {dt:.2f} s  {16*256/dt:.0f} tok/s", flush=True)
if prof:
    from torch.profiler import profile
    with profile() as p:
        llm.generate(prompts(8, 9), sp, use_tqdm=False)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
