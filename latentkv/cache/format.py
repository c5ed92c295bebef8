"""A latent cache's format, decided once from its name and the model dtype: how the latent `c` and the
rope key `k_r` are stored (codes, scales, the rope key's form), the tensors a cache block holds, and the
bytes a token takes. The cache (`LatentCache`) is allocated from it; the writer (attention/paged.py
`write`), the attention kernels' arguments (`LatentCache.kernel_tensors`), the decode plan, the KV store
(the cache's tensors) and the accounting (cache/accounting.py) ask it instead of deciding again.

A format is an entry of FORMATS: the latent's codes (LATENTS) and the rope key's storage (ROPES). A
new format is one more entry there, with its parts in `parts`. The transform-coded latent
(facts.TRANSFORM_CODE, cache/coded.py) is one: its bits differ by layer, so a layer's format carries its
`code` (cache_format(name, dtype, code)), and the format a folder records says which layer's is which.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from latentkv.cache import q4
from latentkv.cache.coded import LayerCode
from latentkv.facts import CACHE_DTYPES, Q4, ROPE8, TRANSFORM_CODE, dtype_name

# the latent's codes: "model" (unquantized, the model dtype), one byte a value with a float32 scale a
# token (scale = max|c| / qmax), q4_0 blocks (cache/q4.py), or a transform code's packed codes with a
# float16 scale per group (cache/coded.py: the rope key's codes with them)
LATENTS = {"model": None, "int8": 127.0, "fp8_e4m3": 448.0, Q4: None, TRANSFORM_CODE: None}  # -> qmax
# the rope key's storage: beside c in one row ("model"), in 16 bits (rope_dtype), int8 codes with a
# second per-token scale, q4_0 blocks turned by a fixed orthogonal map first (cache/q4.py), or in the
# transform code's bytes beside the latent's
ROPES = ("model", "16bit", "int8", Q4, TRANSFORM_CODE)

# facts.CACHE_DTYPES by what they store: (latent codes, rope storage)
FORMATS = {
    "auto": ("model", "model"),
    "int8": ("int8", "16bit"),
    "fp8_e4m3": ("fp8_e4m3", "16bit"),
    "int8" + ROPE8: ("int8", "int8"),
    "fp8_e4m3" + ROPE8: ("fp8_e4m3", "int8"),
    Q4: (Q4, Q4),
    TRANSFORM_CODE: (TRANSFORM_CODE, TRANSFORM_CODE),
}
assert tuple(FORMATS) == (*CACHE_DTYPES, TRANSFORM_CODE), "facts.CACHE_DTYPES and FORMATS must name the same formats"


def rope_dtype(dtype: torch.dtype) -> torch.dtype:
    """The rope key's 16-bit storage beside a quantized latent, for a model in `dtype` (bf16 for float32:
    float32 would make it most of a token's bytes, against bf16's 8 significant bits, finer than the
    int8 latent's 7)."""
    return torch.bfloat16 if dtype == torch.float32 else dtype


@dataclass(frozen=True)
class Part:
    """One tensor of a cache: [num_blocks, block_size, *shape] of dtype."""

    name: str  # "kv" (unquantized [c ; k_r]), or "latent", "scale", "rope"
    dtype: torch.dtype
    shape: tuple[int, ...]  # per token

    @property
    def nbytes(self) -> int:
        """Bytes a token takes in this part."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class CacheFormat:
    name: str  # one of FORMATS (facts.CACHE_DTYPES)
    model_dtype: torch.dtype  # the activations'; an unquantized latent is stored in it
    latent: str  # one of LATENTS
    rope: str  # one of ROPES
    code: LayerCode | None = None  # a transform-coded layer's bits, means and RoPE (None: any other format)

    @property
    def quantized(self) -> bool:
        """Whether the cache holds codes (latent, scale, rope) rather than one [c ; k_r] row."""
        return self.latent != "model"

    @property
    def q4(self) -> bool:
        return self.latent == Q4

    @property
    def coded(self) -> bool:
        """A transform-coded layer (cache/coded.py): packed codes and float16 scales, read by position."""
        return self.latent == TRANSFORM_CODE

    @property
    def rope8(self) -> bool:
        """The rope key in int8 codes, its scale beside the latent's (scale [..., 2])."""
        return self.rope == "int8"

    @property
    def turned_rope(self) -> bool:
        """The rope key is stored turned (cache/q4.py turn): a query's rope part must be turned too."""
        return self.rope == Q4

    @property
    def qmax(self) -> float:
        """The largest code magnitude of a per-token scaled latent (0 for the formats without one: the
        native writer's argument)."""
        return LATENTS[self.latent] or 0.0

    @property
    def native_write(self) -> bool:
        """Whether the native writer (decode_ops write_latent) stores this format (q4_0: the reference
        writes it; a transform code: its own native writer, decode_ops coded_write, cache/coded.py's ops)."""
        return not self.q4 and not self.coded

    @property
    def native_read(self) -> bool:
        """Whether mla_decode reads this format (a transform code: its own kernel, mla_decode_coded, through
        attention/native_backend.py CodedBackend, and the decode plan)."""
        return not self.coded

    @property
    def storage(self) -> str:
        """What a layer's tensors hold, in one name: the latent's codes and the rope key's storage
        (kv_<model dtype>: one [c ; k_r] row; int8_bfloat16, fp8_e4m3_int8, ...; q4_0). The native decode
        kernel takes a cache by it (kernels/attention.py cache_kind), checking the tensors against it."""
        if self.q4 or self.coded:
            return self.latent
        if not self.quantized:
            return f"kv_{dtype_name(self.model_dtype)}"
        return f"{self.latent}_{'int8' if self.rope8 else dtype_name(rope_dtype(self.model_dtype))}"

    @property
    def label(self) -> str:
        """What the start-up line and the capacity report call it: the model dtype for "auto"."""
        return dtype_name(self.model_dtype) if self.name == "auto" else self.name

    def parts(self, rank: int, rope_dim: int) -> tuple[Part, ...]:
        """The tensors a layer of latent width `rank` holds, in the order the kernels and the store take
        them (kv; or latent, scale, rope)."""
        if not self.quantized:
            return (Part("kv", self.model_dtype, (rank + rope_dim,)),)
        if self.coded:
            code = self.code
            if code is None:
                raise ValueError("a transform-coded cache's parts are per layer: its format carries the layer's code")
            if (len(code.latent_bits), len(code.rope_bits)) != (rank, rope_dim):
                raise ValueError(
                    f"the layer's transform code has {len(code.latent_bits)} + {len(code.rope_bits)} directions, "
                    f"its cache {rank} + {rope_dim}"
                )
            return (Part("latent", torch.uint8, (code.code_bytes,)), Part("scale", torch.float16, (code.scales,)))
        if self.q4:
            return (
                Part("latent", torch.uint8, (q4.packed_bytes(rank),)),
                Part("scale", torch.float16, (q4.groups(rank) + q4.groups(rope_dim),)),
                Part("rope", torch.uint8, (q4.packed_bytes(rope_dim),)),
            )
        # fp8 is stored as raw bytes: index_put on float8 tensors is not implemented everywhere
        codes = torch.int8 if self.latent == "int8" else torch.uint8
        rope = torch.int8 if self.rope8 else rope_dtype(self.model_dtype)
        return (
            Part("latent", codes, (rank,)),
            Part("scale", torch.float32, (2,) if self.rope8 else ()),
            Part("rope", rope, (rope_dim,)),
        )

    def bytes_per_token(self, rank: int, rope_dim: int) -> int:
        """Bytes a token takes in a layer of latent width `rank`, scales included."""
        return sum(part.nbytes for part in self.parts(rank, rope_dim))


@functools.cache
def cache_format(name: str, model_dtype: torch.dtype, code: LayerCode | None = None) -> CacheFormat:
    """The format named `name` (facts.CACHE_DTYPES, or facts.TRANSFORM_CODE with a layer's `code`) for a
    model in `model_dtype`; an unknown name is an error naming the known ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown latent cache format {name!r}: expected one of {list(FORMATS)}")
    if (code is not None) != (name == TRANSFORM_CODE and code is not None):
        raise ValueError(f"a {name} cache takes no transform code")
    latent, rope = FORMATS[name]
    return CacheFormat(name, model_dtype, latent, rope, code)
