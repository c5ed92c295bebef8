"""The memory a model will take once loaded, estimated before any weight is read.

From the model as built for its route (on the meta device: model/loader.py `meta_model`): the
parameters in the dtypes the loader gives them, and each quantized linear's packed buffers, which
its own `pack` computes on meta tensors (shapes only, no work), so the estimate follows the
kernels' layouts (row padding, scales per group) without restating them. The loader compares it
with the memory available before it reads anything.
"""

from __future__ import annotations

import torch
from torch import nn

from .quant import QuantLinear

GIB = 1 << 30


def param_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a checkpoint tensor is loaded in: the model's, but the router's float32 (routing
    decisions are precision-sensitive)."""
    return torch.float32 if ".mlp.gate." in name else dtype


def packed_bytes(linear: QuantLinear, dtype: torch.dtype) -> int:
    """Bytes of `linear`'s buffers once packed from a `dtype` weight (its pack run on meta tensors)."""
    with torch.device("meta"):
        probe = type(linear)(linear.in_features, linear.out_features, uses_qlinear=linear.uses_qlinear)
        probe.weight = nn.Parameter(torch.empty(linear.out_features, linear.in_features, dtype=dtype))
        probe.pack_weights()
    return sum(b.nbytes for b in probe.buffers())


def model_bytes(model: nn.Module) -> int:
    """The bytes `model` (built for its route on the meta device, not loaded) holds once loaded: its
    parameters in their load dtypes, its quantized linears packed, its buffers already built."""
    dtype = model.route.dtype
    linears = [m for m in model.modules() if isinstance(m, QuantLinear) and not m.packed]
    sizes: dict[tuple, int] = {}  # packed bytes by (class, shape, kernel): MoE layers repeat a few shapes
    for m in linears:
        key = (type(m), m.in_features, m.out_features, m.uses_qlinear)
        if key not in sizes:
            sizes[key] = packed_bytes(m, dtype)
    total = sum(sizes[(type(m), m.in_features, m.out_features, m.uses_qlinear)] for m in linears)
    packed = {id(m.weight) for m in linears}
    for name, param in model.named_parameters():  # a tied one once, under the embedding's name
        if id(param) not in packed or name.endswith("embed_tokens.weight"):  # a tied lm_head's embedding stays
            total += param.numel() * param_dtype(name, dtype).itemsize
    return total + sum(b.nbytes for b in model.buffers() if not b.is_meta)


def load_bytes(model: nn.Module) -> int:
    """What loading `model` takes: model_bytes plus the largest float weight a quantized linear holds
    before it packs (the loader's working set)."""
    linears = [m for m in model.modules() if isinstance(m, QuantLinear) and not m.packed]
    largest = max((m.out_features * m.in_features for m in linears), default=0) * model.route.dtype.itemsize
    return model_bytes(model) + largest
