"""One memory measurement in a fresh process: `python -m latentkv.bench.memory_probe ENGINE MODEL TOKENS DTYPE`.

Prints JSON: resident set after loading the model, and after holding TOKENS tokens of
context in its cache (latentkv: a cache sized for exactly those tokens; transformers: the
DynamicCache of one forward over them).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import psutil
import torch
from transformers import AutoModelForCausalLM

from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams

MIB = 2**20


def rss() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / MIB


def hold_latentkv(model: str, tokens: int, dtype: str) -> dict:
    cfg = ModelConfig.from_file(Path(model) / "config.json")
    budget = latent_bytes_per_token(cfg, "auto", dtype) * (tokens + 16)
    base = rss()
    llm = LLM(model=model, dtype=dtype, kv_cache_memory=budget, max_model_len=tokens + 16, skip_tokenizer_init=True)
    loaded = rss()
    ids = torch.randint(3, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
    held = rss()
    return {"rss_base_mib": base, "rss_model_mib": loaded, "rss_held_mib": held, "held_delta_mib": held - base}


def hold_transformers(source: str, tokens: int, dtype: str) -> dict:
    base = rss()
    path = Path(source)
    kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    folder = path.parent if path.suffix == ".gguf" else path
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), **kwargs).eval()
    loaded = rss()
    ids = torch.randint(3, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():  # the decoder alone: full-prompt logits would inflate the resident set
        out = model.model(ids, use_cache=True)
    cache = out.past_key_values  # noqa: F841 (held on purpose)
    del out
    held = rss()
    return {"rss_base_mib": base, "rss_model_mib": loaded, "rss_held_mib": held, "held_delta_mib": held - base}


def main() -> None:
    engine, model, tokens, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = hold_latentkv(model, tokens, dtype) if engine == "latentkv" else hold_transformers(model, tokens, dtype)
    print(json.dumps({k: round(v, 1) for k, v in result.items()}))


if __name__ == "__main__":
    main()
