"""The decoder layers of an all-decode step in one native call (kernels/csrc/decode_ops/decode_step.cpp).

The CPU counterpart of nano-vllm capturing its decode step in a CUDA graph: the runner builds a
plan once over its model and caches and replays it for every step whose rows are all
single-token decodes of the absorbed path; other steps (prefill, mixed, naive) run the modules.
The plan calls the same kernels with the same arguments in the same order as the modules do, so
its output is bit-identical (tests/model/test_decode_plan.py); what it removes is the Python
between the kernels — module calls, views, checks — which at short context was ~40% of a
batch-1 step on two threads.

It applies where every piece runs latentkv's own kernels: CPU, float32 / bf16, the native
attention backend, and linears packed for kernels/qlinear.py (int4, int8, w4a8, w8a8, or float32 /
bf16 in batch-invariant mode), a MoE layer's experts in its native call (the router as Gate.forward runs it:
qlinear's moe_route, kernels/csrc/decode_ops/plan_moe.h). Whether it does is read from the model's route
(model/route.py) and its layers' specs (model/spec.py), the ones the modules were built from;
elsewhere `build` says why it does not; `enforce_eager=True` (vLLM's name for running without
CUDA graphs) turns it off.
"""

from __future__ import annotations

import torch

from ..attention.backend import choose_path
from ..attention.metadata import AttentionMetadata
from .. import invariant
from ..cache import coded
from ..kernels import attention as attention_kernels, decode_ops, qlinear
from .deepseek import rope_tables
from .route import KERNEL_DTYPES


class DecodePlan:
    def __init__(self, model, step, cs_views: list):
        self.model = model
        self.step = step  # decode_ops' DecodePlan (decode_step.cpp)
        self.cs_views = cs_views  # a transform-coded cache's kernel views, one per distinct cos / sin table
        layers = model.model.layers
        self.specs = [layer.spec for layer in layers]  # what the modules were built from
        # one per distinct shape: what choose_path reads (heads, ranks, head dims)
        self.shapes = list({(s.n_heads, s.kv_rank, s.dn, s.dr, s.dv): s for s in self.specs}.values())
        # what DeepseekModel.rope_tables gathers every call (30 module lookups and a stack: ~0.1 ms a step)
        self.inv_freq = torch.stack([layer.self_attn.inv_freq for layer in layers])
        self.rope_factor = self.specs[0].rope_factor

    def applies(self, meta: AttentionMetadata) -> bool:
        """Whether the modules would run this step as the plan does: single-token decode rows in
        one group (row b = sequence b), the absorbed path, native decode kernel."""
        return (
            meta.max_query_len == 1
            and meta.groups is None
            and meta.prompt_rows is None
            and meta.path in ("auto", "absorbed")
            and not torch.is_grad_enabled()
            and all(choose_path(layer, meta) == "absorbed" for layer in self.shapes)
        )

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [B] -> final hidden states [B, hidden] (as model(...) returns)."""
        cos, sin = rope_tables(positions, self.inv_freq, self.rope_factor)
        x = self.model.model.embed_tokens(input_ids)
        cs = [
            view.cs(int(meta.context_lens.max())) for view in self.cs_views
        ]  # (grown as native_backend.coded_kernel grows it)
        # the final RMSNorm too (model.model.norm's kernel, in the native call)
        return self.step.run(
            x, cos, sin, meta.slot_mapping, meta.block_tables, meta.context_lens, cs, torch.get_num_threads()
        )


def build(model, caches) -> tuple[DecodePlan | None, str | None]:
    """-> (the plan, None), or (None, why it does not apply to this model)."""
    reason = unsupported(model, caches)
    if reason:
        return None, reason
    plan = decode_ops.extension()
    tables: dict = {}  # a coded layer's cos / sin table: one per distinct RoPE (frequencies, factor)
    with torch.no_grad():
        layers = [
            layer_entry(plan, layer, cache, model.route.dtype, tables)
            for layer, cache in zip(model.model.layers, caches)
        ]
    norm = model.model.norm
    step = plan.DecodePlan(
        layers,
        norm.weight,
        norm.eps,
        qlinear.extension().linear_capsule,
        qlinear.extension().swiglu_capsule,
        qlinear.extension().moe_capsule,
        qlinear.extension().route_capsule,
        attention_kernels.extension().mla_decode_capsule,
        attention_kernels.extension().mla_decode_coded_capsule,
        decode_ops.EXT.caps.mask,
        qlinear.EXT.caps.mask,
        attention_kernels.EXT.caps.mask,
    )
    return DecodePlan(model, step, list(tables.values())), None


def unsupported(model, caches) -> str | None:
    """Why the plan cannot run this model (None: it can), from the route and the layer specs the
    model was built from, and the caches it is handed."""
    route = model.route
    if route.device != "cpu" or route.dtype not in KERNEL_DTYPES:
        return f"runs on CPU float32 / bf16 only (model: {route.device}, {route.dtype})"
    if not route.fused:
        return f"the fused ops do not run ({decode_ops.unavailable_reason()})"
    if route.attention != "native":
        return f"attention backend {route.attention!r}, not native"
    if route.weights == "float" or not route.qlinear:  # every other kind runs the packed kernel where qlinear does
        runs = "torch's matmul" if route.weights == "float" else f"{route.weights} on ATen's kernels"
        return f"the linears run {runs}, not latentkv's packed kernel"
    for layer, cache in zip(model.model.layers, caches):
        spec = layer.spec
        if spec.moe and layer.mlp.native is None:
            return f"layer {spec.index}: MoE experts without their native call"
        if not (cache.format.native_write or cache.format.coded):
            return (
                f"layer {spec.index}: its {cache.format.name} cache is written and read by the per-layer path "
                f"(no native {cache.format.name} write)"
            )
        if cache.dtype != route.dtype:
            return f"layer {spec.index}: cache dtype {cache.dtype} differs from the model's {route.dtype}"
    return None


def linear_entry(plan, linear, swiglu: bool = False):
    """A packed linear as decode_step.cpp takes it (plan_layer.h PlanLinear); `plan`: the decode_ops module;
    swiglu: a [gate; up] linear the plan runs as its SwiGLU (MLP.forward's choice)."""
    return plan.PlanLinear(
        packed=linear.weight_packed, kind=linear.record, out=linear.out_features, bias=linear.bias, swiglu=swiglu
    )


def mlp_entry(plan, mlp, moe: bool, dtype: torch.dtype) -> dict:
    """A dense MLP's packed linears, or a MoE layer's router (deepseek.Gate: its weights and choices)
    and experts (MoE.native), as PlanLayer's fields; dtype: the activations'."""
    if not moe:
        gate_up = mlp.gate_up_proj
        swiglu = mlp.fused and hasattr(gate_up, "swiglu_runs") and gate_up.swiglu_runs(dtype)
        return {"gate_up": linear_entry(plan, gate_up, swiglu), "down": linear_entry(plan, mlp.down_proj)}
    gate, cfg = mlp.gate, mlp.gate.cfg
    bias = gate.e_score_correction_bias
    gate_up, down, shared_gate_up, shared_down, kind, inter, shared_inter = mlp.native
    moe_entry = plan.PlanMoe(
        gate=gate.weight.detach(),
        gate_packed=gate.packed(),
        bias=None if bias is None else bias.detach(),
        softmax=gate.softmax,
        group_limited=gate.group_limited,
        noaux=gate.noaux,
        normalized=gate.normalized,
        n_group=cfg.n_group,
        topk_group=cfg.topk_group,
        k=cfg.num_experts_per_tok,
        scale=float(cfg.routed_scaling_factor),
        safe_rows=invariant.SAFE_ROWS,
        gate_up=gate_up,
        down=down,
        shared_gate_up=shared_gate_up,
        shared_down=shared_down,
        kind=kind,
        inter=inter,
        shared_inter=shared_inter,
    )
    return {"moe": moe_entry}


# PlanLayer's fields that are the layer's spec (model/spec.py LayerSpec), under the spec's names
SPEC_FIELDS = ("n_heads", "dn", "dr", "dv", "kv_rank", "scale", "interleaved", "norm_eps", "latent_eps")


def layer_entry(plan, layer, cache, dtype: torch.dtype, tables: dict):
    """One layer's weights and cache tensors, and the shapes and constants of the spec its modules
    were built from (model/spec.py), as decode_step.cpp takes them (plan_layer.h PlanLayer: a field
    misnamed, mistyped or missing is refused here); dtype: the activations'. tables: the coded layers' cos /
    sin tables so far (a kernel view per RoPE), this layer's added."""
    spec, attn = layer.spec, layer.self_attn
    groups = attn.rope_groups() if attn.folded else None  # the un-mixed rope query, mixed back (MLAttention.project)
    mix, mix_packed = groups.mix_weights(dtype) if groups else (None, None)
    if cache.format.coded:  # W_UK and W_UV turned into the code's basis (CodedBackend.absorbed_attention)
        (w_uk, w_uv_t), (uk_packed, uv_packed), bias = attn.turned_heads(coded.kernel_view(cache.format.code))
    else:
        (w_uk, w_uv_t), (uk_packed, uv_packed), bias = attn.split_kv_b(), attn.head_packs(), None
    kv, latent, cache_scale, cache_rope = cache.kernel_tensors()
    return plan.PlanLayer(
        w_in=layer.input_layernorm.weight,
        w_post=layer.post_attention_layernorm.weight,
        w_q_a_norm=attn.q_a_layernorm.weight if spec.q_lora_rank else None,
        w_kv_a_norm=attn.kv_a_layernorm.weight if spec.kv_a_layernorm else None,
        w_uk=w_uk,
        w_uv_t=w_uv_t,  # packed: empty -> head_matmul packs per call
        uk_packed=w_uk.new_empty(0) if uk_packed is None else uk_packed,
        uv_packed=w_uv_t.new_empty(0) if uv_packed is None else uv_packed,
        qkv_a=linear_entry(plan, attn.qkv_a_proj),
        q_b=linear_entry(plan, attn.q_b_proj) if spec.q_lora_rank else None,
        o=linear_entry(plan, attn.o_proj),
        **mlp_entry(plan, layer.mlp, spec.moe, dtype),
        rope_slots=groups.slots if groups else None,
        mix=mix,
        mix_packed=mix_packed,
        q_dim=attn.split[0],
        **{name: getattr(spec, name) for name in SPEC_FIELDS},
        kv=kv,
        latent=latent,
        cache_scale=cache_scale,
        cache_rope=cache_rope,
        cache_kind=-1 if cache.format.coded else attention_kernels.cache_kind(cache.format.storage),
        qmax=cache.format.qmax,
        block_size=cache.block_size,
        **coded_entry(plan, cache, tables),
        uv_bias=None if bias is None else bias.to(dtype),
    )


def coded_entry(plan, cache, tables: dict) -> dict:
    """A transform-coded cache's code (coded.native_code) and the index of its cos / sin table among
    `tables` (added where its RoPE is new), as PlanLayer's fields; none for any other cache."""
    if not cache.format.coded:
        return {}
    code = cache.format.code
    view = coded.kernel_view(code)
    key = (code.inv_freq, code.rope_factor)
    tables.setdefault(key, view)
    return {"coded": coded.native_code(code, plan), "cs_index": list(tables).index(key)}
