"""The systems a speed bench compares, behind one small interface:
`prepare(prompt_ids)` (untimed: load the context) and `decode(n) -> seconds per token`.

- latentkv: our engine (prefix caching makes the repeated prefill free);
- transformers: any HF folder or GGUF through AutoModelForCausalLM, a manual greedy loop
  with its own KV cache (cropped back to the context between runs);
- llama.cpp: llama-cpp-python on a GGUF, when installed.

The benches run the baselines (transformers, llama.cpp) each in its own process (bench/isolated.py):
one that crashes is recorded, and the bench goes on.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.bench.isolated import start
from latentkv.facts import dtype_name
from latentkv.llm import LLM
from latentkv.model.loader import resolve_dtype
from latentkv.model.shards import weight_files
from latentkv.sampling_params import SamplingParams
from latentkv.sizes import available_memory
from latentkv.sources.gguf_reader import open_reader, read_field

_ids = itertools.count()


class LatentKVSystem:
    def __init__(
        self, name: str, model: str, kv_cache_dtype: str = "auto", max_model_len: int = 8192 + 256, **engine_kwargs
    ):
        self.name = name
        self.kv_cache_dtype = kv_cache_dtype  # as asked (engine.args holds it as served)
        self.llm = LLM(
            model=model,
            kv_cache_dtype=kv_cache_dtype,
            max_model_len=max_model_len,
            skip_tokenizer_init=True,
            max_num_seqs=engine_kwargs.pop("max_num_seqs", 64),
            **engine_kwargs,
        )
        self.engine = self.llm.engine
        self.prompt: list[int] = []

    @property
    def model(self):
        return self.engine.runner.model

    def prepare(self, prompt_ids: list[int]) -> None:
        self.prompt = list(prompt_ids)
        self.generate_timed(1)  # fills the prefix cache with this context

    def generate_timed(self, n: int) -> list[float]:
        """Run one greedy request; timestamps of each generated token."""
        rid = f"bench-{next(_ids)}"
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        self.engine.add_request(rid, self.prompt, params)
        stamps: list[float] = []
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                now = time.perf_counter()
                stamps += [now] * (len(out.outputs[0].token_ids) - len(stamps))
        return stamps

    def decode(self, n: int) -> float:
        stamps = self.generate_timed(n)
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1)

    def close(self) -> None:
        """Close the engine and drop this system's references to it, so that its memory can go (once
        collected) before another engine loads."""
        if self.llm is not None:
            self.llm.close()
        self.llm = self.engine = None


def auto_dtype() -> torch.dtype:
    """The dtype latentkv's `dtype="auto"` runs on this machine (bf16 only where the CPU computes
    it natively): every system of a bench runs it, so no baseline is timed in emulated bf16."""
    return resolve_dtype("auto", torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def cache_budget(model: str, tokens: int) -> str:
    """A latent-cache size for `tokens` tokens of latent in the auto dtype: each bench system gets
    what it needs instead of a share of free memory (several engines live in one bench process)."""
    cfg = ModelConfig.from_file(Path(model) / "config.json")
    return f"{1 + latent_bytes_per_token(cfg, 'auto', dtype_name(auto_dtype())) * tokens // 2**20}MiB"


def load_hf(source: str, dtype: torch.dtype | None = None):
    dtype = dtype or auto_dtype()
    path = Path(source)
    if path.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


class TransformersSystem:
    def __init__(self, name: str, source: str, dtype: torch.dtype | None = None):
        self.name = name
        self.model = load_hf(source, dtype)
        self.cache = None

    @torch.inference_mode()
    def prepare(self, prompt_ids: list[int]) -> None:
        ids = torch.tensor([prompt_ids])
        out = self.model(ids, use_cache=True, logits_to_keep=1)  # not [T, vocab] float logits of the whole prompt
        self.cache, self.context = out.past_key_values, len(prompt_ids)
        self.first = out.logits[:, -1].argmax(-1, keepdim=True)

    @torch.inference_mode()
    def decode(self, n: int) -> float:
        extra = self.cache.get_seq_length() - self.context
        if extra > 0:
            self.cache.crop(-extra)  # back to the prepared context
        token, start = self.first, time.perf_counter()
        for _ in range(n - 1):
            out = self.model(token, past_key_values=self.cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        return (time.perf_counter() - start) / (n - 1)


def llama_cpp_available() -> bool:
    try:  # llama-cpp-python is optional (the `bench` extra)
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def transformers_baseline(
    name: str, source, failed: dict, factory: str = "latentkv.bench.systems:TransformersSystem"
) -> list:
    """[`factory` (transformers) on `source`, in its own process] ([] with the reason in `failed` if it
    fails to load, or is skipped before loading: a GGUF architecture transformers cannot read, or a
    model that would not fit in the memory available now — the OOM killer may pick the bench itself)."""
    reason = transformers_cannot_load(Path(source))
    if reason:
        failed[name] = f"skipped: {reason}"
        print(f"{name}: skipped (recorded; the bench goes on): {reason}", flush=True)
        return []
    return start(failed, name, factory, str(source))


def transformers_cannot_load(source: Path) -> str | None:
    """Why transformers cannot load `source` in the auto dtype here, or None."""
    if source.suffix == ".gguf":
        reader = open_reader(source)
        arch = read_field(reader, "general.architecture")
        if arch not in GGUF_SUPPORTED_ARCHITECTURES:
            return f"transformers cannot read a {arch!r} GGUF ({source.name})"
        params = sum(int(t.n_elements) for t in reader.tensors)
    else:
        params = folder_parameters(source)
    need, free = params * auto_dtype().itemsize, available_memory(torch.device("cpu"))
    if need > 0.9 * free:
        return (
            f"{source.name} takes ~{need / 2**30:.1f} GiB in {dtype_name(auto_dtype())}, "
            f"{free / 2**30:.1f} GiB is available"
        )
    return None


def folder_parameters(folder: Path) -> int:
    """Parameters of a safetensors folder, from the headers (no tensor is read)."""
    total = 0
    for file in weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                total += math.prod(f.get_slice(key).get_shape())
    return total


def llama_cpp_baseline(name: str, source, n_ctx: int, failed: dict) -> list:
    """[llama.cpp on `source`, in its own process] when it is a GGUF and llama-cpp-python is installed,
    else [] (saying so when it is not installed; recording why in `failed` when it does not start)."""
    if not (source and str(source).endswith(".gguf")):
        return []
    if not llama_cpp_available():
        print("llama.cpp: skipped (llama-cpp-python is not installed; `pip install latentkv[bench]`)")
        return []
    return start(failed, name, "latentkv.bench.systems:LlamaCppSystem", str(source), n_ctx=n_ctx)


class LlamaCppSystem:
    def __init__(self, name: str, gguf: str, n_ctx: int = 8192 + 256):
        from llama_cpp import Llama  # optional (the `bench` extra); only when this baseline runs

        self.name = name
        self.llm = Llama(model_path=gguf, n_ctx=n_ctx, n_batch=512, n_threads=torch.get_num_threads(), verbose=False)

    def prepare(self, prompt_ids: list[int]) -> None:
        self.prompt = list(prompt_ids)
        self.llm.reset()
        self.llm.eval(self.prompt)  # once: later runs truncate the KV cache back to this

    def decode(self, n: int) -> float:
        self.llm.n_tokens = len(self.prompt) - 1  # eval() drops cache entries past n_tokens
        self.llm.eval(self.prompt[-1:])
        token, start = self.argmax(), time.perf_counter()
        for _ in range(n - 1):
            self.llm.eval([token])
            token = self.argmax()
        return (time.perf_counter() - start) / (n - 1)

    def argmax(self) -> int:
        """Greedy choice from the last evaluated token's logits."""
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))
