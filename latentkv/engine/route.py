"""The route a step takes, said once at start (`LLMEngine.from_args` prints it): the model's
`Route` (model/route.py, decided once when the model was built: dtypes, the ISA each native
extension it uses serves with, the attention backend, the linears, batch invariance), with what
the modules built from it run — the backend's prefill and decode kernels, the linears' kinds
(quant.linear_kind), how MoE experts run — and whether the decode plan runs (and why not)."""

from __future__ import annotations

from collections import Counter

from torch import nn

from ..facts import dtype_name
from ..kernels import sample as sample_kernel
from ..model.quant import QuantLinear, linear_kind

FAMILIES = ("attention", "decode_ops", "qlinear")  # kernels/: the native extensions


def kernels_isa(route) -> str:
    """'attention avx512_bf16, decode_ops avx512, qlinear avx512' ('unavailable' where the route
    asked and it did not build, 'unused' where the route does not use it)."""
    isas = dict(route.isas)
    return ", ".join(f"{family} {isas.get(family, 'unused')}" for family in FAMILIES)


def linear_kinds(model) -> str:
    """'qkv_a/o/gate_up/down/...: w4a8 (native) x120; lm_head: bfloat16 torch padded'."""
    body = Counter(
        linear_kind(module)
        for name, module in model.model.named_modules()
        if isinstance(module, (nn.Linear, QuantLinear)) and not name.endswith("kv_b_proj")
    )
    layers = ", ".join(f"{kind} x{count}" for kind, count in sorted(body.items()))
    return f"layers {layers}; lm_head {linear_kind(model.lm_head)}"


def moe_route(model) -> str:
    """'; MoE experts native call' (deepseek.MoE: one native call per layer) or 'per-expert loop'
    (moe_reference); '' for a model without MoE layers."""
    moe = [layer.mlp for layer in model.model.layers if layer.spec.moe]
    if not moe:
        return ""
    return f"; MoE experts {'native call' if all(m.native is not None for m in moe) else 'per-expert loop'}"


def describe(model, plan_reason: str | None) -> str:
    """One line: dtype, cache dtype, ISA per extension, attention backend with its prefill and
    decode paths, linear kinds (and how MoE experts run), decode plan on/off and why, batch
    invariance on/off, the sampler."""
    route = model.route
    dtype, device, invariant = route.dtype, route.device, route.batch_invariant
    backend = model.model.layers[0].self_attn.backend.for_format(route.cache_format)
    return (
        f"route: dtype {dtype_name(dtype)}, cache {route.cache_format.label}; isa {kernels_isa(route)}; "
        f"attention {backend.name} (prefill {backend.prefill_route(dtype, device, invariant)}, "
        f"decode {backend.decode_route(dtype, device, invariant)}); linears {linear_kinds(model)}{moe_route(model)}; "
        f"decode plan {'off (' + plan_reason + ')' if plan_reason else 'on'}; "
        f"batch invariance {'on' if invariant else 'off'}; sampler {sampler_route(device)}"
    )


def sampler_route(device: str) -> str:
    """'native avx512' (kernels/sample.py) or 'torch' (engine/sampler.py's reference ops)."""
    if device == "cpu" and sample_kernel.available():
        return f"native {sample_kernel.EXT.choose()}"
    return "torch"
