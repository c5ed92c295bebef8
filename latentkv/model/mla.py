"""Multi-head Latent Attention (DeepSeek-V2/V3), names from the paper and the checkpoints.

Per token: q = W_q x (or W_qb · RMSNorm(W_qa x)), split per head into q_nope (dn) and
q_rope (dr); [c ; k_r] = W_kva x, c = RMSNorm(c), k_r = RoPE(k_r). The cache holds only
c (kv_rank) and k_r (dr) per token.

Two ways to attend, same numbers:
- naive: expand every cached c with W_kvb into per-head k_nope (dn) and v (dv);
- absorbed: fold W_UK into the query (q_lat = W_UK_hᵀ q_nope, size kv_rank) and W_UV
  after attention, so attention is MQA with one key head [c ; k_r] of width
  kv_rank + dr and value c. Decode reads only the latent.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .batch import AttentionBatch
from .norm import RMSNorm
from .rope import apply_rope, attention_factor, layer_inv_freq, softmax_scale


# DeepSeek's code and transformers build the q_a / kv_a norms with their default eps,
# not the config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.dn, self.dr, self.dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_rank = cfg.kv_rank(layer)
        self.q_lora_rank = cfg.q_lora_rank
        qk_dim = self.n_heads * (self.dn + self.dr)
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, qk_dim, bias=False)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, qk_dim, bias=cfg.q_bias)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, self.kv_rank + self.dr, bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, LATENT_NORM_EPS) if cfg.kv_a_layernorm else None
        self.kv_b_proj = nn.Linear(self.kv_rank, self.n_heads * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.dv, cfg.hidden_size, bias=cfg.attention_bias)
        self.interleaved = cfg.rope_interleave
        self.scale = softmax_scale(cfg)
        self.rope_factor = attention_factor(cfg.rope_scaling)
        self.register_buffer("inv_freq", layer_inv_freq(cfg, layer), persistent=False)
        self.in_proj, self.in_split = None, None  # engine-only fusion of q(_a) and kv_a (fuse.py)
        self.absorbed = None  # engine-only contiguous (W_UK, W_UV) (fuse.py)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch, cache) -> torch.Tensor:
        """x [T, hidden], rope = (cos, sin) [T, dr/2] of this layer -> [T, hidden];
        writes this step's latents to cache."""
        q_nope, q_rope, c, k_r = self.project(x, rope)
        cache.write(c, k_r, batch.slot_mapping)  # every group's new latents first: each reads its own
        if batch.groups is None:
            out = self.attend(q_nope, q_rope, batch, cache)
        else:
            out = q_nope.new_empty(x.shape[0], self.n_heads, self.dv)
            for rows, group in batch.groups:
                out[rows] = self.attend(q_nope[rows], q_rope[rows], group, cache)
        return self.o_proj(out.flatten(1))

    def attend(self, q_nope, q_rope, batch: AttentionBatch, cache) -> torch.Tensor:
        """q_nope [T,H,dn], q_rope [T,H,dr] (flat order, already in the cache) -> [T,H,dv]."""
        if batch.runs is not None:  # one sequence: views of its runs of blocks, no gather copy
            pieces = cache.pieces(batch.runs, batch.max_context_len)  # [1, L_i, kv_rank + dr] each
        else:
            pieces = [cache.gather(batch.block_tables)[:, : batch.max_context_len]]  # [B, L, kv_rank + dr]
        single = batch.num_seqs == 1  # the flat batch already is the padded one
        if single:
            q_nope, q_rope = q_nope[None], q_rope[None]
        else:
            q_nope, q_rope = q_nope[batch.query_index], q_rope[batch.query_index]  # [B, Qmax, H, *]
        if self.choose_path(batch, batch.max_context_len) == "absorbed":
            out = self.attend_absorbed(q_nope, q_rope, pieces, batch)
        else:
            out = self.attend_naive(q_nope, q_rope, pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1), batch)
        return out[0] if single else out[batch.query_valid]  # [T, H, dv], back in flat order

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """-> q_nope [T,H,dn], q_rope [T,H,dr] (rotated), c [T,kv_rank], k_r [T,dr] (rotated)."""
        if self.in_proj is not None:
            q, kv = self.in_proj(x).split(self.in_split, dim=-1)
        else:
            q = self.q_a_proj(x) if self.q_lora_rank else self.q_proj(x)
            kv = self.kv_a_proj_with_mqa(x)
        if self.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(q))
        q = q.view(x.shape[0], self.n_heads, self.dn + self.dr)
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        c, k_r = kv.split([self.kv_rank, self.dr], dim=-1)
        if self.kv_a_layernorm is not None:
            c = self.kv_a_layernorm(c)
        # q's heads and the shared key rotate by the same angles: one call for both
        rotated = apply_rope(torch.cat((q_rope, k_r[:, None]), dim=1), *rope, self.interleaved)
        return q_nope, rotated[:, :-1], c, rotated[:, -1]

    def choose_path(self, batch: AttentionBatch, key_len: int) -> str:
        """Pick the cheaper path by multiply-adds on the padded shapes."""
        if batch.path != "auto":
            return batch.path
        b, q, h, r = batch.num_seqs, batch.max_query_len, self.n_heads, self.kv_rank
        naive = b * key_len * r * h * (self.dn + self.dv) + b * q * key_len * h * (self.dn + self.dr + self.dv)
        absorbed = b * q * h * r * (self.dn + self.dv) + b * q * key_len * h * (2 * r + self.dr)
        return "absorbed" if absorbed <= naive else "naive"

    def split_kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_kvb -> W_UK [H, dn, kv_rank] and W_UVᵀ [H, kv_rank, dv], as the absorbed bmm's take them."""
        if self.absorbed is not None:
            return self.absorbed
        w = self.kv_b_proj.weight.view(self.n_heads, self.dn + self.dv, self.kv_rank)
        return w[:, : self.dn], w[:, self.dn :].transpose(1, 2)

    def attend_absorbed(self, q_nope, q_rope, pieces: list[torch.Tensor], batch: AttentionBatch) -> torch.Tensor:
        """q_* [B,Q,H,*], pieces [B,L_i,r+dr] (the context in order) -> [B,Q,H,dv].
        MQA over the latent: all (query, head) rows attend to the one latent key head.
        Plain matmuls: for these short query blocks they beat SDPA's CPU kernels several
        times over; the context is read piece by piece, so its views are never copied."""
        b, q, h, _ = q_nope.shape
        w_uk, w_uv_t = self.split_kv_b()
        q_lat = torch.bmm(q_nope.permute(2, 0, 1, 3).reshape(h, b * q, self.dn), w_uk)  # [H, B*Q, r]
        q_lat = q_lat.view(h, b, q, self.kv_rank).permute(1, 2, 0, 3)
        # the softmax scale goes on the small query, not on the [B, Q*H, L] scores
        query = (torch.cat((q_lat, q_rope), dim=-1) * self.scale).view(b, q * h, -1)
        scores = torch.cat([score(query, kv) for kv in pieces], dim=-1)  # [B, Q*H, L]
        if batch.mask_kind != "none":
            scores = scores.masked_fill(~batch.key_mask(scores.shape[-1], heads=h)[:, 0], float("-inf"))
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
        o_lat, start = None, 0
        for kv in pieces:  # [B, Q*H, r + dr], summed over the pieces
            part = weigh(probs[..., start : start + kv.shape[1]], kv)
            o_lat, start = part if o_lat is None else o_lat + part, start + kv.shape[1]
        o_lat = o_lat[..., : self.kv_rank]  # the values are the latent c, not k_r
        out = torch.bmm(o_lat.reshape(b * q, h, self.kv_rank).transpose(0, 1), w_uv_t)  # [H, B*Q, dv]
        return out.transpose(0, 1).reshape(b, q, h, self.dv)

    def attend_naive(self, q_nope, q_rope, kv, batch: AttentionBatch) -> torch.Tensor:
        """Expand the latent to per-head keys and values, then ordinary attention."""
        b, length = kv.shape[:2]
        h = self.n_heads
        c, k_r = kv.split([self.kv_rank, self.dr], dim=-1)
        k_nope, v = self.kv_b_proj(c).view(b, length, h, self.dn + self.dv).split([self.dn, self.dv], dim=-1)
        key = torch.cat((k_nope, k_r[:, :, None, :].expand(b, length, h, self.dr)), dim=-1)
        query = torch.cat((q_nope, q_rope), dim=-1)
        if self.dv < query.shape[-1]:
            # SDPA's flash kernels need v as wide as q and k; without this they fall back to
            # the math path (3x slower on CPU at 2K tokens). Padding is exact: its outputs are dropped.
            v = F.pad(v, (0, query.shape[-1] - self.dv))
        kind = batch.mask_kind
        mask = batch.key_mask(length) if kind == "explicit" else None
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=kind == "causal",
            scale=self.scale,
        )
        return out.transpose(1, 2)[..., : self.dv]


def score(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """query [B, M, D] · kv [B, L, D] -> [B, M, L]; at B = 1 as one linear (the GEMV path)."""
    if query.shape[0] == 1:
        return F.linear(query[0], kv[0])[None]
    return torch.bmm(query, kv.transpose(1, 2))


def weigh(probs: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """probs [B, M, L] · kv [B, L, D] -> [B, M, D]. All D columns: a matmul over the
    contiguous rows is faster on CPU than one over the strided first r columns."""
    if probs.shape[0] == 1:
        return torch.mm(probs[0], kv[0])[None]
    return torch.bmm(probs, kv)
