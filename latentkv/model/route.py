"""The route of a model's steps, decided once: which kernels its modules run.

`decide_route` is the one place that decides it, from the device, the dtype, the latent cache's
dtype, the weights (a quantization, batch invariance), the attention backend asked for, what the
native extensions built (their switches LATENTKV_NATIVE / LATENTKV_FUSED / LATENTKV_QLINEAR
included) and the instruction set each serves with (LATENTKV_CPU_ISA). The model is built from
the `Route` (`MLAForCausalLM(cfg, route)`: the linear classes, whether the per-layer ops run
native, the attention backend, W_UK / W_UV's storage), so nothing is swapped in after loading; the
decode plan reads it (model/decode_plan.py) and the engine prints it (engine/route.py).
What stays per call depends on the input: a step's rows (prompt or decode, the path by cost, the
backend's kernel for the query's dtype) and autograd (training runs the PyTorch reference ops).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import resolve_backend
from ..cache.format import CacheFormat, cache_format
from ..kernels import attention as attention_kernels, decode_ops, qlinear
from .packed import PackedLinear
from .quant import INT4_GROUP, INT_DOT, LINEAR_CLASSES, QUANTIZATIONS, SKIP

KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what the fused ops and the fixed-order linears take
# how a model's linears compute: torch's matmul, latentkv's fixed-order kernel, or a quantization
WEIGHTS = ("float", "fixed-order") + QUANTIZATIONS


@dataclass(frozen=True)
class Route:
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    cache_dtype: str = (
        "auto"  # the latent cache's format by name (facts.CACHE_DTYPES, facts.TRANSFORM_CODE; "auto": the model dtype)
    )
    attention: str = "torch"  # the attention backend (attention.BACKENDS), resolved
    fused: bool = False  # the per-layer ops run native (model/fused.py, kernels/decode_ops.py)
    qlinear: bool = False  # latentkv's packed-linear kernel runs the packed linears (else ATen's int kernels)
    weights: str = "float"  # one of WEIGHTS
    batch_invariant: bool = False
    isas: tuple[tuple[str, str], ...] = ()  # (extension, the ISA it serves with) for those the route asked

    @property
    def cache_format(self) -> CacheFormat:
        """What the latent cache stores (cache/format.py): its name and the model dtype decide it."""
        return cache_format(self.cache_dtype, self.dtype)

    @property
    def absorbed_dtype(self) -> torch.dtype | None:
        """W_UK / W_UV's storage for inference (None: the weight's dtype). Beside quantized linears
        on the CPU, bf16 with kv_b_proj's values rounded to the bf16 grid when loaded
        (MLAttention.pack_weights), so the naive and absorbed paths use the same weights: half the
        bytes of float32 (at short context those reads were ~12% of an int4 decode step)."""
        return torch.bfloat16 if self.weights in QUANTIZATIONS and self.device == "cpu" else None

    def linear_class(self, name: str, in_features: int) -> type | None:
        """The class a linear named `name` is built as (None: torch's nn.Linear / PackedLinear).
        kv_b_proj stays torch's (quant.SKIP: the absorbed path reads its weight); int4 on ATen's
        kernel needs whole groups of inputs, so other linears keep the model dtype there."""
        if self.weights == "float" or name in SKIP:
            return None
        if self.weights == "int4" and not self.qlinear and in_features % INT4_GROUP:
            return None
        return LINEAR_CLASSES[self.weights]

    def linear(self, name: str, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
        cls = self.linear_class(name, in_features)
        if cls is None:
            return nn.Linear(in_features, out_features, bias=bias)
        return cls(in_features, out_features, bias, uses_qlinear=self.qlinear)

    def packed_linear(self, name: str, in_features: int, parts: list[tuple[str, int, bool]]) -> nn.Module:
        """Linears that read the same input as one (model/packed.py): `parts` (checkpoint name, rows, bias)."""
        cls = self.linear_class(name, in_features)
        if cls is None:
            return PackedLinear(in_features, parts)
        return cls(in_features, sum(rows for _, rows, _ in parts), any(b for _, _, b in parts), parts, self.qlinear)


def decide_route(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    attention_backend: str = "auto",
    quantization: str | None = None,
    batch_invariant: bool = False,
    cache_dtype: str = "auto",
) -> Route:
    """The route for a model on `device` in `dtype`. An extension is asked (and built, on first
    use) only where the route could use it: qlinear for a quantization or batch invariance.
    quantization int4 / w4a8 / w8a8 are CPU-only; w4a8 / w8a8 run int4 / int8 weights with float
    activations (one warning) where the kernel is not built. batch_invariant: the linears take the
    fixed-order kernel (CPU float32 / bf16, where it is built)."""
    device = torch.device(device).type
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if quantization in ("int4", *INT_DOT) and device != "cpu":
        raise ValueError(f"quantization {quantization!r} has CPU kernels only; device must be 'cpu', got {device!r}")
    asked = {
        "attention": attention_backend in ("auto", "native"),
        "decode_ops": device == "cpu" and dtype in KERNEL_DTYPES,
        "qlinear": device == "cpu" and bool(quantization or batch_invariant),
    }
    uses_qlinear = asked["qlinear"] and qlinear.available()
    weights = quantization or (
        "fixed-order" if batch_invariant and uses_qlinear and dtype in KERNEL_DTYPES else "float"
    )
    if weights in INT_DOT and not uses_qlinear:
        warnings.warn(
            f"latentkv: {weights} needs the native linears ({qlinear.unavailable_reason()}); "
            f"using {INT_DOT[weights]} weights with float activations instead",
            RuntimeWarning,
            stacklevel=2,
        )
        weights = INT_DOT[weights]
    isas = tuple(
        (ext.family, ext.choose() if ext.available() else "unavailable")
        for ext in (attention_kernels.EXT, decode_ops.EXT, qlinear.EXT)
        if asked[ext.family]
    )
    return Route(
        device=device,
        dtype=dtype,
        cache_dtype=cache_dtype,
        attention=resolve_backend(attention_backend),
        fused=asked["decode_ops"] and decode_ops.available(),
        qlinear=uses_qlinear,
        weights=weights,
        batch_invariant=batch_invariant,
        isas=isas,
    )
