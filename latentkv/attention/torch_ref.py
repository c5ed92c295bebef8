"""The reference backend: plain PyTorch on any device (the numbers other backends must match)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import invariant
from .backend import AttentionBackend
from .metadata import AttentionMetadata
from .paged import gather, pieces, read_positions

KEY_TILE = 256  # keys per online-softmax step, at fixed absolute positions [0, 256), [256, 512), ...
QUERY_CHUNK = 256  # query tokens per pass: scores stay [B, QUERY_CHUNK * H, KEY_TILE] whatever the prompt


class TorchBackend(AttentionBackend):
    name = "torch"

    def prefill_route(self, dtype: torch.dtype, device: str, invariant: bool) -> str:
        """The kernel prompt rows take (the start-up line names it)."""
        return "SDPA tiles at fixed positions" if invariant else "naive or absorbed by cost"

    def decode_route(self, dtype: torch.dtype, device: str, invariant: bool) -> str:
        """The kernel decode rows take."""
        return "latent tiles at fixed positions" if invariant else "absorbed matmuls"

    def read(self, cache, meta: AttentionMetadata) -> list[torch.Tensor]:
        """The context as [B, L_i, r + dr] pieces in order: for one sequence on a few runs of
        blocks, views of the cache (no gather copy); otherwise one gathered copy."""
        if meta.runs is not None:
            return pieces(cache, meta.runs, meta.max_context_len)
        return [gather(cache, meta.block_tables)[:, : meta.max_context_len]]

    def context(self, cache, meta: AttentionMetadata) -> torch.Tensor:
        parts = self.read(cache, meta)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def latent_attention(self, query, cache, meta: AttentionMetadata) -> torch.Tensor:
        if meta.invariant or meta.max_context_len > KEY_TILE and meta.max_query_len > 1:
            return tiled_latent_attention(query, cache, meta)
        return self.whole_latent_attention(query, cache, meta)

    def whole_latent_attention(self, query, cache, meta: AttentionMetadata) -> torch.Tensor:
        """Plain matmuls: for these short query blocks they beat SDPA's CPU kernels several
        times over; the context is read piece by piece, so its views are never copied."""
        parts = self.read(cache, meta)
        scores = torch.cat([score(query, kv) for kv in parts], dim=-1)  # [B, Q*H, L]
        if meta.mask_kind != "none":
            heads = query.shape[1] // meta.max_query_len
            scores = scores.masked_fill(~meta.key_mask(scores.shape[-1], heads=heads)[:, 0], float("-inf"))
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
        o_lat, start = None, 0
        for kv in parts:  # [B, Q*H, r + dr], summed over the pieces
            part = weigh(probs[..., start : start + kv.shape[1]], kv)
            o_lat, start = part if o_lat is None else o_lat + part, start + kv.shape[1]
        return o_lat[..., : cache.kv_rank]  # the values are the latent c, not k_r

    def dense_attention(self, query, key, value, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        dv = value.shape[-1]
        if dv < query.shape[-1]:
            # SDPA's flash kernels need v as wide as q and k; without this they fall back to
            # the math path (3x slower on CPU at 2K tokens). Padding is exact: its outputs are dropped.
            value = F.pad(value, (0, query.shape[-1] - dv))
        kind = meta.mask_kind
        mask = meta.key_mask(key.shape[1]) if kind == "explicit" else None
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            attn_mask=mask,
            is_causal=kind == "causal",
            scale=scale,
        )
        return out.transpose(1, 2)[..., :dv]


def tiled_latent_attention(query: torch.Tensor, cache, meta: AttentionMetadata) -> torch.Tensor:
    """query [B, Q*H, r+dr] (absorbed, scaled) -> o_lat [B, Q*H, r], batch-invariant and memory-bounded.

    Each query row reduces over its visible keys in tiles at fixed absolute positions, in
    order, in float32 (online softmax): its bits depend only on its own sequence's cache and
    position, not on the batch, the chunking or whether its keys were written in this step
    (a tile's keys past the row are masked to weight 0, which adds exactly nothing). Query
    rows go QUERY_CHUNK tokens at a time, so nothing larger than [B, QUERY_CHUNK*H, KEY_TILE]
    scores or [B, KEY_TILE, r+dr] latent rows is materialized, however long the context."""
    b, rows, _ = query.shape
    heads, r = rows // meta.max_query_len, cache.kv_rank
    out = query.new_empty(b, rows, r)
    offsets = torch.arange(KEY_TILE, device=query.device)
    for first in range(0, meta.max_query_len, QUERY_CHUNK):
        last = min(first + QUERY_CHUNK, meta.max_query_len)
        q = query[:, first * heads : last * heads].float()
        pos = meta.query_pos[:, first:last].repeat_interleave(heads, dim=1)  # [B, m]
        top = q.new_full(pos.shape, float("-inf"))
        total = q.new_zeros(pos.shape)
        acc = q.new_zeros(*pos.shape, r)
        for start in range(0, int(pos.max()) + 1, KEY_TILE):
            keys = start + offsets
            # [B, KEY_TILE, r+dr], zero rows past each context
            kv = read_positions(cache, meta.block_tables, meta.context_lens, start, start + KEY_TILE).float()
            scores = invariant.bmm(q, kv.transpose(1, 2)).masked_fill(keys[None, None] > pos[..., None], float("-inf"))
            now = torch.maximum(top, scores.amax(-1))
            alpha = torch.exp(top - now)  # 1 where the tile adds nothing (top holds): exact no-op
            probs = torch.exp(scores - now[..., None])
            total = total * alpha + probs.sum(-1)
            acc = acc * alpha[..., None] + invariant.bmm(probs, kv[..., :r])
            top = now
        out[:, first * heads : last * heads] = (acc / total[..., None]).to(out.dtype)
    return out


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
