"""Multi-head Latent Attention (DeepSeek-V2/V3), names from the paper and the checkpoints.

Per token: q = W_q x (or W_qb · RMSNorm(W_qa x)), split per head into q_nope (dn) and
q_rope (dr); [c ; k_r] = W_kva x, c = RMSNorm(c), k_r = RoPE(k_r). The cache holds only
c (kv_rank) and k_r (dr) per token.

Two ways to attend, same numbers:
- naive: expand every cached c with W_kvb into per-head k_nope (dn) and v (dv);
- absorbed: fold W_UK into the query (q_lat = W_UK_hᵀ q_nope, size kv_rank) and W_UV
  after attention, so attention is MQA with one key head [c ; k_r] of width
  kv_rank + dr and value c. Decode reads only the latent.
The cache, the masks and the choice between the two belong to the attention backend
(latentkv/attention/); this module is the math it calls back into (attention/layer_api.py names
it). A converted GQA model's structural savings are converted.py's.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import invariant
from ..attention.backend import AttentionBackend
from ..attention.layer_api import LatentTurn
from ..attention.metadata import AttentionMetadata
from ..config import ModelConfig
from . import fused
from .converted import ConvertedStructure, weight_version
from .norm import RMSNorm
from ..rope import apply_rope, layer_inv_freq
from .route import Route
from .spec import LayerSpec


class MLAttention(ConvertedStructure, nn.Module):
    """One layer's MLA: the projections, RoPE, absorption and naive expansion; the attention backend
    (attention/layer_api.py `AttentionLayer`: what it may call back) does the rest. A converted GQA
    model's savings (rope groups, kv groups, the padded kv_b_proj) are ConvertedStructure's
    (model/converted.py)."""

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, route: Route, backend: AttentionBackend):
        super().__init__()
        self.spec = spec
        self.n_heads, self.dn, self.dr, self.dv, self.kv_rank = spec.n_heads, spec.dn, spec.dr, spec.dv, spec.kv_rank
        self.q_lora_rank = spec.q_lora_rank
        self.fused = route.fused  # the native per-layer ops (model/fused.py), decided once
        # q (or q_a) and [c ; k_r] read the same x: one matmul
        self.qkv_a_proj = route.packed_linear("qkv_a_proj", spec.hidden, spec.qkv_a_parts)
        if spec.q_lora_rank:
            self.q_a_layernorm = RMSNorm(spec.q_lora_rank, spec.latent_eps, route.fused)
            self.q_b_proj = route.linear("q_b_proj", spec.q_lora_rank, spec.qk_dim)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, spec.latent_eps, route.fused) if spec.kv_a_layernorm else None
        self.kv_b_proj = route.linear("kv_b_proj", self.kv_rank, self.n_heads * (self.dn + self.dv))
        self.o_proj = route.linear("o_proj", self.n_heads * self.dv, spec.hidden, bias=spec.attention_bias)
        self.split = [spec.q_dim, self.kv_rank + self.dr]
        self.interleaved, self.scale, self.rope_factor = spec.interleaved, spec.scale, spec.rope_factor
        self.register_buffer("inv_freq", layer_inv_freq(cfg, spec.index), persistent=False)
        self.backend = backend
        self._absorbed = (
            None,
            None,
            (None, None),
        )  # (weight version, contiguous W_UK / W_UVᵀ, their head_packs) for inference
        self._turned = (None, None, None)  # (W_UK it was folded from, the turn, turned_heads' weights)
        # their storage dtype for inference (None: the weight's); bf16 beside quantized linears, with
        # kv_b_proj's values on the bf16 grid (pack_weights), so both paths use the same weights
        self.absorbed_dtype = route.absorbed_dtype
        self.init_structure()

    @torch.no_grad()
    def pack_weights(self) -> None:
        """Once loaded (loader.load_model): kv_b_proj's values rounded to the absorbed dtype's grid."""
        if self.absorbed_dtype is not None:
            self.kv_b_proj.weight.copy_(self.kv_b_proj.weight.to(self.absorbed_dtype))
        self.find_structure()

    def q_linear(self) -> nn.Module:
        """The linear whose first rows are the query's (q_b_proj, or the packed q / [c ; k_r] projection)."""
        return self.q_b_proj if self.q_lora_rank else self.qkv_a_proj

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, cache
    ) -> torch.Tensor:
        """x [T, hidden], rope = (cos, sin) [T, dr/2] of this layer -> [T, hidden];
        writes this step's latents to cache."""
        # this step's latents go in first (every group of the step reads its own); with the native ops one
        # native pass rotates k_r, quantizes c and stores both
        native = fused.runs(self.fused)
        q_nope, q_rope, c, k_r = self.project(x, rope, rotate_key=not native)
        fused.write_latent(
            cache, c, k_r, meta.slot_mapping, (*rope, self.interleaved) if native else None, kernel=native, angles=rope
        )
        out = self.backend.forward(self, q_nope, q_rope, cache, meta)  # [T, H, dv]
        return self.o_proj(out.flatten(1))

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], rotate_key: bool = True):
        """-> q_nope [T,H,dn], q_rope [T,H,dr] (rotated; [T,H,2F] un-mixed where the projection
        is folded: full_rope mixes it), c [T,kv_rank], k_r [T,dr] (rotated unless rotate_key is
        False: then the fused cache write rotates it)."""
        q, kv = self.qkv_a_proj(x).split(self.split, dim=-1)
        if self.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(q))
        q = q.view(x.shape[0], self.n_heads, -1)
        q_nope, q_rope = q[..., : self.dn], q[..., self.dn :]
        c, k_r = kv.split([self.kv_rank, self.dr], dim=-1)
        if self.kv_a_layernorm is not None:
            c = self.kv_a_layernorm(c)
        if self.folded:  # the un-mixed rope query (converted.py) turns on its own slots
            q_rope = self.rotate_folded(q_rope, rope)
            if rotate_key:
                k_r = apply_rope(k_r[:, None], *rope, self.interleaved)[:, 0]
            return q_nope, q_rope, c, k_r
        if not rotate_key:
            return q_nope, fused.rope(q_rope, *rope, self.interleaved, kernel=True), c, k_r
        # q's heads and the shared key rotate by the same angles: one call for both
        rotated = apply_rope(torch.cat((q_rope, k_r[:, None]), dim=1), *rope, self.interleaved)
        return q_nope, rotated[:, :-1], c, rotated[:, -1]

    def split_kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_kvb -> W_UK [H, dn, kv_rank] and W_UVᵀ [H, kv_rank, dv], as the absorbed bmm's take them.
        Without autograd they are cached contiguous (strided views cost a copy per call), in
        `absorbed_dtype`, refreshed whenever the weight changes."""
        return self._split_and_packs()[0]

    def head_packs(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """split_kv_b()'s weights in the native head_matmul's AMX layout (fused.head_pack; empty off
        AMX), cached and refreshed with them; None under autograd."""
        return self._split_and_packs()[1]

    def _split_and_packs(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple]:
        """(split_kv_b's weights, head_packs'), from one check of the weight's version."""
        weight = self.kv_b_proj.weight
        training = torch.is_grad_enabled()  # gradients flow through the views
        version = None if training else weight_version(weight)
        if version is not None and self._absorbed[0] == version:
            return self._absorbed[1:]
        w = weight.view(self.n_heads, self.dn + self.dv, self.kv_rank)
        w_uk, w_uv_t = w[:, : self.dn], w[:, self.dn :].transpose(1, 2)
        if training:
            return (w_uk, w_uv_t), (None, None)
        dtype = self.absorbed_dtype or weight.dtype
        w_uk, w_uv_t = w_uk.to(dtype).contiguous(), w_uv_t.to(dtype).contiguous()
        packs = (fused.head_pack(w_uk), fused.head_pack(w_uv_t)) if self.fused else (None, None)
        self._absorbed = (version, (w_uk, w_uv_t), packs)  # loaded or trained: refreshed
        return self._absorbed[1:]

    def turned_heads(self, turn: LatentTurn):
        """W_UK and W_UVᵀ folded with a cache's turn (attention/layer_api.py LatentTurn): W_UK Mᵀ [H, dn, C]
        and Mᵀ W_UVᵀ [H, C, dv] (products in float32, stored in the weight's dtype), their head_packs, and
        W_UV's image of the turn's mean [H, dv] float32 (None without) -> ((w_uk, w_uv_t), (packs), bias).
        Cached while the weights and the turn stay."""
        (w_uk, w_uv_t), _ = self._split_and_packs()
        if self._turned[0] is w_uk and self._turned[1] is turn:
            return self._turned[2]
        dtype = self.kv_b_proj.weight.dtype  # (not the absorbed dtype's grid: the products are not on it)
        uk = (w_uk.float() @ turn.latent_map.T).to(dtype).contiguous()
        uv = (turn.out_map.T @ w_uv_t.float()).to(dtype).contiguous()
        packs = (fused.head_pack(uk), fused.head_pack(uv)) if self.fused else (None, None)
        bias = None if turn.latent_mean is None else turn.latent_mean @ w_uv_t.float()
        turned = ((uk, uv), packs, bias)
        if not torch.is_grad_enabled():
            self._turned = (w_uk, turn, turned)
        return turned

    def absorb(self, q_nope: torch.Tensor, q_rope: torch.Tensor, turn: LatentTurn | None = None) -> torch.Tensor:
        """q_nope [B,Q,H,dn], q_rope [B,Q,H,dr] (as project() gives it) -> the latent query [B, Q*H, kv_rank + dr]
        (q_lat = W_UKᵀ q_nope beside q_rope), softmax scale included; with a turn, in its basis: the turned
        W_UK's columns beside turn.turn_rope of the rope query [B, Q*H, C + E]."""
        b, q, h, _ = q_nope.shape
        q_rope = self.full_rope(q_rope)
        if turn is None:
            (w_uk, _), (uk_packed, _) = self._split_and_packs()
        else:
            (w_uk, _), (uk_packed, _), _ = self.turned_heads(turn)
            q_rope = turn.turn_rope(q_rope)
        if fused.runs(self.fused):  # one native call; each row reduces in a fixed order (batch-invariant)
            rows = fused.head_matmul(
                q_nope.reshape(b * q, h, self.dn),
                w_uk,
                self.scale,
                q_rope.reshape(b * q, h, -1),
                kernel=True,
                packed=uk_packed,
            )
            return rows.view(b, q * h, -1)
        q_lat = invariant.bmm(
            q_nope.permute(2, 0, 1, 3).reshape(h, b * q, self.dn), w_uk.to(q_nope.dtype)
        )  # [H, B*Q, r]
        q_lat = q_lat.view(h, b, q, -1).permute(1, 2, 0, 3)
        # the softmax scale goes on the small query, not on the [B, Q*H, L] scores
        return (torch.cat((q_lat, q_rope), dim=-1) * self.scale).view(b, q * h, -1)

    def unabsorb(self, o_lat: torch.Tensor, q: int, turn: LatentTurn | None = None) -> torch.Tensor:
        """o_lat [B, Q*H, kv_rank] (attention output in latent space; with a turn, [B, Q*H, C] in its basis)
        -> W_UV o_lat [B,Q,H,dv] (with a turn: the turned W_UV's, plus its image of the turn's mean)."""
        b, h = o_lat.shape[0], self.n_heads
        bias = None
        if turn is None:
            (_, w_uv_t), (_, uv_packed) = self._split_and_packs()
        else:
            (_, w_uv_t), (_, uv_packed), bias = self.turned_heads(turn)
        width = o_lat.shape[-1]
        if fused.runs(self.fused):
            out = fused.head_matmul(o_lat.reshape(b * q, h, width), w_uv_t, kernel=True, packed=uv_packed)
        else:
            out = invariant.bmm(o_lat.reshape(b * q, h, width).transpose(0, 1), w_uv_t.to(o_lat.dtype)).transpose(0, 1)
        out = out.reshape(b, q, h, self.dv)
        return out if bias is None else out + bias.to(out.dtype)

    def expand(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows [B, L, kv_rank + dr] -> per-head keys [B,L,H,dn+dr] and values [B,L,H,dv]."""
        b, length = kv.shape[:2]
        h = self.n_heads
        k_r = kv[..., self.kv_rank :]
        k_nope, v = self.expand_latent(kv).view(b, length, h, self.dn + self.dv).split([self.dn, self.dv], dim=-1)
        return torch.cat((k_nope, k_r[:, :, None, :].expand(b, length, h, self.dr)), dim=-1), v

    def expand_latent(self, rows: torch.Tensor) -> torch.Tensor:
        """kv_b_proj of cached rows' latents: rows [..., kv_rank + dr] -> [..., H * (dn + dv)] (through
        the zero-padded weight where that applies: ConvertedStructure.padded_expand)."""
        out = self.padded_expand(rows)
        return self.kv_b_proj(rows[..., : self.kv_rank]) if out is None else out
