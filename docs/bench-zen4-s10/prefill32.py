import cProfile, pstats, time, glob, sys
import torch
from latentkv import LLM, SamplingParams
model = sorted(glob.glob("/root/.cache/latentkv/converted/*"))[0]
llm = LLM(model=model, max_model_len=1024, skip_tokenizer_init=True, max_num_seqs=64, threads=2, enable_prefix_caching=False)
vocab = llm.engine.cfg.vocab_size
g = torch.Generator().manual_seed(0)
mk = lambda: [torch.randint(3, vocab, (256,), generator=g).tolist() for _ in range(32)]
sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
llm.generate([{"prompt_token_ids": p} for p in mk()[:4]], sp, use_tqdm=False)
for rep in range(2):
    prompts = mk()
    prof = cProfile.Profile()
    t = time.perf_counter(); prof.enable()
    llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    prof.disable(); dt = time.perf_counter() - t
    print(f"32x256 prefill (max_tokens 1): {dt:.2f}s = {32*256/dt:.0f} tok/s", flush=True)
pstats.Stats(prof).sort_stats("tottime").print_stats(25)
