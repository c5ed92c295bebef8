"""`EngineArgs`: every engine option, checked once when constructed.

`OPTION_CHECKS` is the one rule per option: `EngineArgs` applies it to its fields, and
`--config` files and command-line flags (latentkv/settings.py) apply the same rule to the
same names, so an error there names the key or flag that gave the value.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from latentkv.facts import (
    ATTENTION_BACKEND_DEFAULT,
    ATTENTION_BACKENDS,
    ATTENTION_PATHS,
    BLOCK_SIZES,
    CACHE_DTYPE_ALIASES,
    ENGINE_CACHE_DTYPES,
    MODEL_DTYPE_ALIASES,
    MODEL_DTYPES,
    TRANSFORM_CODE,
)
from latentkv.model.quant import QUANTIZATIONS
from latentkv.sizes import parse_memory

STORE_MAX_SIZE = "10GiB"  # default bound of a --kv-store directory
WARM_FRACTION = 0.05  # default share of the cache --warm templates may pin


def positive_int(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError
    return value


def non_negative_int(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError
    return value


def boolean(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "on", "yes", "1", "false", "off", "no", "0"):
        return value.lower() in ("true", "on", "yes", "1")
    raise ValueError


def text(value):
    if not isinstance(value, str) or not value:
        raise ValueError
    return value


def choice(allowed, aliases=None):
    def check(value):
        value = (aliases or {}).get(value, value)
        if value not in allowed:
            raise ValueError
        return value

    return check


def model_dtype(value):
    """A dtype name (or alias), "auto", or one of the torch dtypes itself."""
    if isinstance(value, torch.dtype) and value in MODEL_DTYPES.values():
        return value
    return choice(("auto", *MODEL_DTYPES), MODEL_DTYPE_ALIASES)(value)


def quantization(value):
    """None or "none" (plain linears) -> None; else a weight-only scheme."""
    return None if value in (None, "none") else choice(QUANTIZATIONS)(value)


def fraction(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError
    return float(value)


def share(value):
    """A fraction in [0, 1] (0 allowed: nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError
    return float(value)


def memory(value):
    return parse_memory(value)  # its ValueError says what is wrong with the size


# The token budget of a step when none is given: 1,024 (vLLM's CPU server takes 2,048). A step that
# prefills a chunk holds up every running sequence's next token for as long as the chunk takes, and the
# prompts of one chunk get their first tokens together at its end. Measured on a 2-core Zen 4 with vLLM's
# client (32 in flight, 256 in / 128 out, temperature 1.0): V3-mini (bf16) mean TTFT 13.9 -> 10.5 s at the
# same 95 tok/s (512: 9.2 s, 92 tok/s); SmolLM2 3.8 -> 3.0 s, throughput level (246-249 / 241-252 tok/s).
BATCHED_TOKENS = 1024

# option -> (the allowed values in words, check returning the clean value or raising ValueError)
OPTION_CHECKS = {
    "model": ("a path", text),
    "tokenizer": ("a path", text),
    "dtype": (f"one of {['auto', *MODEL_DTYPES]}", model_dtype),
    "kv_cache_dtype": (
        f"one of {list(ENGINE_CACHE_DTYPES)} ('auto': the folder's own format where it records one, "
        "else the model dtype; 'bfloat16' / 'float32': the unquantized latent, the model dtype; "
        f"{TRANSFORM_CODE!r}: a folder's transform-coded cache, what 'auto' serves where it records one)",
        choice((*ENGINE_CACHE_DTYPES, TRANSFORM_CODE), CACHE_DTYPE_ALIASES),
    ),
    "quantization": (
        f"one of {['none', *QUANTIZATIONS]} (int8 / int4: weight-only; w4a8 / w8a8: int8 activations too; "
        "w4a8_g128: w4a8 on groups of 128, faster at many rows, coarser; int4, w4a8*, w8a8: CPU)",
        quantization,
    ),
    "block_size": (f"one of {list(BLOCK_SIZES)}", choice(BLOCK_SIZES)),
    "kv_cache_memory": ('a positive size such as "2GiB", "512MiB" or a number of bytes', memory),
    "kv_cache_blocks": ("a positive number of cache blocks", positive_int),
    "kv_cache_fraction": ("a fraction in (0, 1]", fraction),
    "max_model_len": ("a positive integer", positive_int),
    "max_num_seqs": ("a positive integer", positive_int),
    "max_num_batched_tokens": ("a positive integer", positive_int),
    "enable_prefix_caching": ("true or false", boolean),
    "nan_check": ("true or false", boolean),
    "batch_invariant": ("true or false", boolean),
    "enforce_eager": ("true or false", boolean),
    "skip_tokenizer_init": ("true or false", boolean),
    "seed": ("an integer >= 0", non_negative_int),
    "attention_path": (f"one of {list(ATTENTION_PATHS)}", choice(ATTENTION_PATHS)),
    "attention_backend": (
        f"one of {list(ATTENTION_BACKENDS)} ('auto': native where it builds)",
        choice(ATTENTION_BACKENDS),
    ),
    "threads": ("a positive number of threads", positive_int),
    "kv_store": ("a directory path", text),
    "kv_store_max_size": ('a positive size such as "20GiB" or a number of bytes', memory),
    "warm": ("a JSONL file path", text),
    "warm_fraction": ("a fraction in [0, 1]", share),
}


def check_option(name: str, value, where: str | None = None, checks: dict = OPTION_CHECKS):
    """`value` cleaned by the rule for option `name`; else ValueError naming `where` (the
    TOML key or flag that gave it; default the option's name) and the allowed values."""
    allowed, check = checks[name]
    try:
        return check(value)
    except (ValueError, TypeError) as err:
        why = f" ({err})" if str(err) else ""
        raise ValueError(f"{where or name} = {value!r} is not valid{why}; allowed: {allowed}") from None


@dataclass
class EngineArgs:
    model: str
    tokenizer: str | None = None
    dtype: str | torch.dtype = "auto"
    device: str | None = None  # None: cuda when available, else cpu
    kv_cache_dtype: str = "auto"  # "auto" (the folder's own, else the model dtype) | "int8" | "fp8_e4m3"
    #                                         | "int8_rope8" | "fp8_e4m3_rope8" | "q4_0" | "bfloat16" | "float32"
    block_size: int = 16
    kv_cache_memory: int | str | None = None  # bytes or e.g. "2GiB" (read into bytes here)
    kv_cache_blocks: int | None = None  # or a number of blocks; neither: kv_cache_fraction
    kv_cache_fraction: float | None = None  # of free memory (default 0.9 on CUDA, 0.25 on CPU)
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # None: max(BATCHED_TOKENS, max_num_seqs)
    enable_prefix_caching: bool = True
    seed: int = 0
    skip_tokenizer_init: bool = False
    nan_check: bool = False
    batch_invariant: bool = True  # same tokens alone, batched, chunked or prefix-cached (docs/internals.md)
    enforce_eager: bool = False  # every step through the modules, no decode plan (vLLM's name: no CUDA graphs)
    attention_path: str = "auto"  # "auto" | "naive" | "absorbed"
    quantization: str | None = (
        None  # None | "int8" | "int4" (weight-only) | "w4a8" | "w4a8_g128" | "w8a8" (int8 activations too; CPU)
    )
    attention_backend: str = (
        ATTENTION_BACKEND_DEFAULT  # "auto" (native where it builds, else torch) | "native" | "torch"
    )
    threads: int | None = (
        None  # torch = OpenMP threads; None: cpu.default_threads() (all cores; engine/threads.py backs off)
    )
    kv_store: str | None = None  # directory of the on-disk latent store (docs/store.md); None: off
    kv_store_max_size: int | str = STORE_MAX_SIZE  # the whole directory (read into bytes), LRU-evicted beyond
    warm: str | None = None  # JSONL of template prompts / conversations prefilled at start
    warm_fraction: float = WARM_FRACTION  # of the cache's blocks the templates may pin in RAM

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in OPTION_CHECKS and not (value is None and f.default is None):
                setattr(self, f.name, check_option(f.name, value))
        if self.kv_cache_memory is not None and self.kv_cache_blocks is not None:
            raise ValueError(
                f"give kv_cache_memory ({self.kv_cache_memory} bytes) or kv_cache_blocks "
                f"({self.kv_cache_blocks}), not both: they size the same cache"
            )
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            # else the oldest sequences would take every step's budget and the rest wait
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}): every running sequence decodes each step"
            )
