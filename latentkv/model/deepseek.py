"""The DeepSeek-V2/V3 decoder: MLA attention, SwiGLU MLP, MoE with shared experts.

Module and parameter names match the Hugging Face checkpoints, so loading is a
name-for-name copy.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import invariant
from ..attention import get_backend
from ..attention.backend import AttentionBackend
from ..attention.metadata import AttentionMetadata, build_metadata
from ..cache.latent_cache import LatentCache, allocate_caches
from ..config import ModelConfig
from ..kernels import qlinear
from ..sizes import return_freed_memory
from . import fused
from .mla import MLAttention, weight_version
from .norm import RMSNorm
from ..rope import cos_sin
from .route import Route, decide_route
from .spec import LayerSpec, layer_spec


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, inter_dim: int, route: Route):
        super().__init__()
        self.gate_up_proj = route.packed_linear(
            "gate_up_proj", dim, [("gate_proj", inter_dim, False), ("up_proj", inter_dim, False)]
        )
        self.down_proj = route.linear("down_proj", inter_dim, dim)
        self.fused = route.fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # with decode_ops' SwiGLU, a bf16 product on AMX takes it in its last step (the same bits)
        swiglu = getattr(self.gate_up_proj, "swiglu", None) if self.fused else None
        h = swiglu(x) if swiglu is not None else None
        if h is None:
            h = fused.silu_mul(self.gate_up_proj(x), kernel=self.fused)
        return self.down_proj(h)


class Gate(nn.Module):
    """Router: softmax (V2) or sigmoid + bias-corrected choice (V3), group-limited top-k. Its choices
    from the config are attributes: the decode plan (kernels/csrc/decode_ops/plan_moe.h) runs the same
    ops from them."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Routing decisions are precision-sensitive: the gate stays in float32 whatever the model dtype.
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size, dtype=torch.float32))
        self.noaux = cfg.topk_method == "noaux_tc"  # V3: bias-corrected choice, groups by their two best
        if self.noaux:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_routed_experts, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None
        self.softmax = cfg.scoring_func == "softmax"  # else sigmoid
        self.group_limited = cfg.limits_groups
        self.normalized = cfg.normalizes_topk
        self._packed = (None, None)  # (weight version, packed()), for inference

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> [T, E] float32 (even in bf16), each row's bits whatever T: latentkv's fixed-order
        kernel where it runs (MKL's sgemm rounds rows by M on the AMX Xeon at K = 2048 even padded to
        12), else the padded sgemm (invariant.linear)."""
        packed = self.packed()
        if packed is not None:
            return qlinear.linear(x.float().contiguous(), packed, 32, self.weight.shape[0])
        return invariant.linear(x.float(), self.weight.float())

    def packed(self) -> torch.Tensor | None:
        """The weight in qlinear's float32 record, cached while it is unchanged; None under autograd,
        off CPU or where the kernel is not built."""
        if torch.is_grad_enabled() or self.weight.device.type != "cpu" or not qlinear.available():
            return None
        version = weight_version(self.weight)
        if self._packed[0] != version:
            self._packed = (version, qlinear.pack_f32(self.weight.detach()))
        return self._packed[1]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> weights [T, k] (float32), expert ids [T, k]. On CPU where qlinear is built, the
        route after the logits is its native pass (kernels/qlinear.py moe_route; the decode plan calls
        the same); elsewhere, and under autograd, `route` (the same steps in torch ops)."""
        logits = self.logits(x)
        if logits.device.type == "cpu" and not torch.is_grad_enabled() and qlinear.available():
            cfg = self.cfg
            return qlinear.moe_route(
                logits,
                self.e_score_correction_bias,
                self.softmax,
                cfg.n_group,
                cfg.topk_group,
                self.noaux,
                self.group_limited,
                cfg.num_experts_per_tok,
                self.normalized,
                float(cfg.routed_scaling_factor),
            )
        return self.route(logits)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [T, E] float32 -> weights [T, k] (float32), expert ids [T, k], in torch ops."""
        cfg = self.cfg
        scores = logits.softmax(-1) if self.softmax else logits.sigmoid()
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias
        if self.group_limited:
            choice = self.limit_groups(choice)
        ids = choice.topk(cfg.num_experts_per_tok, dim=-1)[1]
        weights = scores.gather(1, ids)
        if self.normalized:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, ids

    def limit_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """Keep experts of the best `topk_group` groups only."""
        cfg = self.cfg
        grouped = choice.view(choice.shape[0], cfg.n_group, -1)
        if self.noaux:  # V3: a group scores by its two best experts
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
            fill = float("-inf")
        else:  # V2 group_limited_greedy: by its best expert
            group_scores = grouped.amax(-1)
            fill = 0.0
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(cfg.topk_group, dim=-1)[1], True)
        return grouped.masked_fill(~keep[:, :, None], fill).view_as(choice)


def moe_reference(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: nn.ModuleList, shared: nn.Module | None
) -> torch.Tensor:
    """What the native call (kernels/qlinear.py `moe`) computes, with the modules: x [T, D], the router's
    weights [T, k] (float32) and expert ids [T, k] -> [T, D] in x's dtype. Each expert this batch routes
    to runs on its tokens; then per token the weighted sum of its slots' expert outputs in slot order,
    then the shared experts' output, in float32 (each product and sum rounded once), rounded to x's
    dtype once. Runs where the native call does not (torch's or ATen's linears, autograd, CUDA)."""
    y = x.new_zeros(*ids.shape, x.shape[-1])  # [T, k, D]: each slot's expert output, in x's dtype
    for e in ids.unique().tolist():  # only the experts this batch routes to
        token, slot = torch.where(ids == e)
        y[token, slot] = experts[e](x[token])
    acc = torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    for s in range(ids.shape[1]):
        acc = acc + weights[:, s, None] * y[:, s]
    if shared is not None:
        acc = acc + shared(x)
    return acc.to(x.dtype)


class MoE(nn.Module):
    """Routed experts (the Gate's top k of n per token) and shared experts. Where the experts' linears
    run latentkv's packed kernel (the route's), one native call runs them all (kernels/qlinear.py `moe`,
    from pack_weights on); elsewhere, and under autograd, moe_reference. `experts` stays a ModuleList
    of MLPs: the checkpoint's names."""

    def __init__(self, cfg: ModelConfig, route: Route):
        super().__init__()
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, cfg.moe_intermediate_size, route) for _ in range(cfg.n_routed_experts)
        )
        self.inter, self.shared_inter = cfg.moe_intermediate_size, cfg.moe_intermediate_size * cfg.n_shared_experts
        self.shared_experts = MLP(cfg.hidden_size, self.shared_inter, route) if self.shared_inter else None
        self.native: tuple | None = None  # the native call's weights and shapes (pack_weights), or None

    @torch.no_grad()
    def pack_weights(self) -> None:
        """Once loaded: the experts' linears packed (here first: a caller may reach this module before
        them) and, where all run latentkv's packed kernel (one record kind, no bias), each projection's
        records stacked over the routed experts for the native call; an expert's buffer becomes its view
        of the stack (no second copy is kept)."""
        mlps = [*self.experts, *([self.shared_experts] if self.shared_experts is not None else [])]
        linears = [linear for mlp in mlps for linear in (mlp.gate_up_proj, mlp.down_proj)]
        for linear in linears:
            if hasattr(linear, "pack_weights"):
                linear.pack_weights()
        kinds = {getattr(linear, "record", None) for linear in linears}
        if len(kinds) != 1 or None in kinds or any(linear.bias is not None for linear in linears):
            return
        stacks = []
        for name in ("gate_up_proj", "down_proj"):
            stack = torch.stack([getattr(mlp, name).weight_packed for mlp in self.experts])
            for mlp, view in zip(self.experts, stack):
                getattr(mlp, name).weight_packed = view
            stacks.append(stack)
        # the experts' own buffers just went; glibc would keep them resident between live ones
        # (a model's worth of experts: V2-Lite's w4a8 load peaked at 14.6 GiB instead of ~11)
        return_freed_memory()
        shared = (
            [None, None]
            if self.shared_experts is None
            else [self.shared_experts.gate_up_proj.weight_packed, self.shared_experts.down_proj.weight_packed]
        )
        self.native = (*stacks, *shared, kinds.pop(), self.inter, self.shared_inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> [T, D]."""
        weights, ids = self.gate(x)
        if self.native is not None and not torch.is_grad_enabled():
            return qlinear.moe(x, weights, ids, *self.native)
        return moe_reference(x, weights, ids, self.experts, self.shared_experts)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T], inv_freq [layers, dr/2] -> cos, sin [layers, T, dr/2] times the attention
    factor (YaRN's; a factor of 1 is skipped: x * 1.0 is x). Layers that rotate at one set of
    frequencies (all but a per-layer conversion's) share one table, expanded (a 2,048-token prefill
    step's 30 tables took ~5 ms)."""
    if inv_freq.shape[0] > 1 and bool((inv_freq == inv_freq[:1]).all()):
        cos, sin = rope_tables(positions, inv_freq[:1], factor)
        return cos.expand(inv_freq.shape[0], -1, -1), sin.expand(inv_freq.shape[0], -1, -1)
    cos, sin = cos_sin(positions, inv_freq)
    return (cos, sin) if factor == 1.0 else (cos * factor, sin * factor)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: LayerSpec, route: Route, backend: AttentionBackend):
        super().__init__()
        self.spec = spec  # what the modules are built from; the decode plan reads the same
        self.self_attn = MLAttention(cfg, spec, route, backend)
        self.mlp = MoE(cfg, route) if spec.moe else MLP(spec.hidden, spec.intermediate, route)
        self.input_layernorm = RMSNorm(spec.hidden, spec.norm_eps, route.fused)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.norm_eps, route.fused)

    def forward(self, x, rope, meta, cache, h=None):
        """x [T, hidden] -> (x', h') [T, hidden] each: the layer's output is x' + h', the residual
        stream and the MLP's output, added by the next norm in its pass (as the decode plan does:
        the sum rounds as x + h does). With h, the stream coming in is x + h."""
        x, normed = self.input_layernorm(x, h) if h is not None else (x, self.input_layernorm(x))
        x, normed = self.post_attention_layernorm(x, self.self_attn(normed, rope, meta, cache))
        return x, self.mlp(normed)


class DeepseekModel(nn.Module):
    def __init__(self, cfg: ModelConfig, route: Route, backend: AttentionBackend):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, layer_spec(cfg, i), route, backend) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, route.fused)

    def forward(self, input_ids, positions, meta, caches):
        x, h = self.embed_tokens(input_ids), None
        cos, sin = self.rope_tables(positions)
        for i, (layer, cache) in enumerate(zip(self.layers, caches)):
            x, h = layer(x, (cos[i], sin[i]), meta, cache, h)
        return self.norm(x) if h is None else self.norm(x, h)[1]  # h is None: no layers

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [layers, T, dr/2] for every layer at once (layers may rotate at
        different frequencies in converted models), in float32."""
        inv_freq = torch.stack([layer.self_attn.inv_freq for layer in self.layers])
        return rope_tables(positions, inv_freq, self.layers[0].self_attn.rope_factor)


class MLAForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, route: Route | None = None):
        """Built as `route` says (model/route.py; None: decide_route()'s CPU float32 default):
        the linear classes, the fused ops, the attention backend."""
        super().__init__()
        self.config = cfg
        self.route = route or decide_route()
        self.model = DeepseekModel(cfg, self.route, get_backend(self.route.attention))
        self.lm_head = self.route.linear("lm_head", cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def pack_weights(self) -> None:
        """Once the loader filled the weights: each module that keeps them in a kernel's layout
        (model/quant.py) packs them (those the loader packed as they filled are skipped), and the
        attention stores W_UK / W_UV as the route says."""
        for module in self.modules():
            if module is not self and hasattr(module, "pack_weights") and not getattr(module, "packed", False):
                module.pack_weights()

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (linears may be stored as int8 with scales of this dtype)."""
        return self.model.embed_tokens.weight.dtype

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, caches: list
    ) -> torch.Tensor:
        """input_ids, positions [T] (flat batch) -> final hidden states [T, hidden]."""
        return self.model(input_ids, positions, meta, caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab] in float32."""
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def full_logits(self, token_ids: torch.Tensor, path: str = "naive", cache_dtype: str = "auto") -> torch.Tensor:
        """Score whole sequences: token_ids [B, S] -> logits [B, S, vocab] (no autograd)."""
        return self.forward_sequences(token_ids, path, cache_dtype)

    def forward_sequences(
        self, token_ids: torch.Tensor, path: str = "naive", cache_dtype: str = "auto"
    ) -> torch.Tensor:
        """Whole sequences through a throwaway cache (one block each), differentiable:
        token_ids [B, S] -> logits [B, S, vocab]. Used for scoring and for healing."""
        b, s = token_ids.shape
        caches = allocate_caches(self.config, b, s, self.dtype, cache_dtype, self.device)
        meta, positions = build_metadata([s] * b, [s] * b, [[i] for i in range(b)], s, self.device, path)
        hidden = self(token_ids.reshape(-1).to(self.device), positions, meta, caches)
        return self.compute_logits(hidden).view(b, s, -1)

    @torch.no_grad()
    def forward_layer(self, i: int, hidden: torch.Tensor, cache_dtype: str = "auto") -> torch.Tensor:
        """The residual stream [B, S, hidden] of whole sequences (positions 0..S-1) after
        decoder layer i alone (the converter refits and measures layer by layer)."""
        b, s, d = hidden.shape
        cfg = self.config
        cache = LatentCache(b, s, cfg.kv_rank(i), cfg.qk_rope_head_dim, self.dtype, cache_dtype, self.device)
        meta, positions = build_metadata([s] * b, [s] * b, [[j] for j in range(b)], s, self.device, "naive")
        cos, sin = self.model.rope_tables(positions)
        x, h = self.model.layers[i](hidden.reshape(-1, d).to(self.dtype), (cos[i], sin[i]), meta, cache)
        return (x + h).view(b, s, d)
