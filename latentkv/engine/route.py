"""The route a step takes, said once at start (`LLMEngine.from_args` prints it): the dtypes, the
instruction set each native extension serves with, the attention backend's prefill and decode
kernels, the linears' kinds, whether the decode plan runs (and why not), and batch invariance.
Each part asks the code that decides it (the backend's routes, quant.linear_kind, the kernels'
chosen ISA, decode_plan's reason), so the line says what runs."""
from __future__ import annotations

from collections import Counter

from torch import nn

from ..facts import dtype_name
from ..kernels import attention, decode_ops, qlinear
from ..model.quant import QuantLinear, linear_kind


def kernels_isa() -> str:
    """'attention avx512_bf16, decode_ops avx512, qlinear avx512' (or 'attention unavailable', ...)."""
    parts = []
    for family in (attention, decode_ops, qlinear):
        ext = family.EXT
        parts.append(f"{ext.family} {ext.choose() if ext.available() else 'unavailable'}")
    return ", ".join(parts)


def linear_kinds(model) -> str:
    """'qkv_a/o/gate_up/down/...: w4a8 (native) x120; lm_head: bfloat16 torch padded'."""
    body = Counter(linear_kind(module) for name, module in model.model.named_modules()
                   if isinstance(module, (nn.Linear, QuantLinear)) and not name.endswith("kv_b_proj"))
    layers = ", ".join(f"{kind} x{count}" for kind, count in sorted(body.items()))
    return f"layers {layers}; lm_head {linear_kind(model.lm_head)}"


def describe(model, caches, batch_invariant: bool, plan_reason: str | None) -> str:
    """One line: dtype, cache dtype, ISA per extension, attention backend with its prefill and
    decode paths, linear kinds, decode plan on/off and why, batch invariance on/off."""
    dtype, device = model.dtype, model.device.type
    backend = model.model.layers[0].self_attn.backend
    cache = caches[0].cache_dtype if caches[0].quantized else dtype_name(caches[0].dtype)
    return (f"route: dtype {dtype_name(dtype)}, cache {cache}; isa {kernels_isa()}; "
            f"attention {backend.name} (prefill {backend.prefill_route(dtype, device, batch_invariant)}, "
            f"decode {backend.decode_route(dtype, device, batch_invariant)}); linears {linear_kinds(model)}; "
            f"decode plan {'off (' + plan_reason + ')' if plan_reason else 'on'}; "
            f"batch invariance {'on' if batch_invariant else 'off'}")
