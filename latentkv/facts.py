"""Facts the whole package shares, each stated once (imported by settings, engine,
cache, model loader, converter and eval alike; this module imports nothing of latentkv)."""

from __future__ import annotations

import torch

# Model (weight and activation) dtypes by name. "auto" (model.loader.resolve_dtype): float16 on CUDA;
# on CPU bfloat16 where the CPU has avx512_bf16 or AMX (cpu.native_bf16), else float32.
MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# Latent cache dtypes: "auto" stores the latent in the model dtype; int8 / fp8_e4m3 store one
# byte per element plus a float32 scale per token and layer, the rope key beside it
# in 16 bits; the "_rope8" forms store the rope key in int8 too, with a scale of its own per token
# (a converted model's rope pairs are equalized for it: convert/rope_scale.py). "q4_0" stores
# both in llama.cpp's q4_0 blocks: 4-bit codes with a float16 scale per Q4_GROUP values (the last
# group of each may be shorter), the rope key turned by a fixed orthogonal map first
# (cache/q4.py says why). What each stores, and its bytes per token: cache/format.py.
ROPE8 = "_rope8"
Q4 = "q4_0"
CACHE_DTYPES = ("auto", "int8", "fp8_e4m3", "int8" + ROPE8, "fp8_e4m3" + ROPE8, Q4)
# A transform-coded latent (cache/transform_code.py: bits per direction, per layer): a format a folder
# records (convert --kv-bytes) and is served in for "auto", never one asked for by name.
TRANSFORM_CODE = "transform_code"
# What a server may ask for besides: the unquantized latent by vLLM's names for it, whatever format the
# folder records ("auto" serves the folder's own); the name must be the model dtype.
UNQUANTIZED_CACHES = ("bfloat16", "float32")
ENGINE_CACHE_DTYPES = CACHE_DTYPES + UNQUANTIZED_CACHES
CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3", "fp8" + ROPE8: "fp8_e4m3" + ROPE8}
Q4_GROUP, Q4_SCALE_BYTES = 32, 2


# Tokens per cache block (powers of two: the block runs and prefix hashes assume it).
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)

# Attention: the backends ("auto": native where its kernels build, else the PyTorch reference;
# the default everywhere) and the paths ("auto": decode absorbed, prefill by cost).
ATTENTION_BACKENDS = ("auto", "native", "torch")
ATTENTION_BACKEND_DEFAULT = "auto"
ATTENTION_PATHS = ("auto", "naive", "absorbed")

# config.json model_type of the models latentkv serves (MLA) and of the sources it converts.
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
SOURCE_MODEL_TYPES = ("llama", "qwen2", "mistral")


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")
