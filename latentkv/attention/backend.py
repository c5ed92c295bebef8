"""The attention-backend seam (docs/internals.md, "Attention backends").

`MLAttention` (model/mla.py) does the math in the paper's names and hands the rest to
`backend.forward(layer, q_nope, q_rope, cache, meta) -> [T, H, dv]` (the layer has written the step's
latents: model/fused.py write_latent). The driver here is shared: split mixed steps into groups, pick the path by
cost, pad the flat batch to [B, Qmax] and back. A backend gives the kernels:
`latent_attention` (absorbed MQA over the paged latent: paged MLA decode),
`dense_attention` (the naive path on expanded keys) and `context` (rows to expand).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .layer_api import AttentionLayer
from .metadata import AttentionMetadata
from .prefill import invariant_prefill


def choose_path(layer: AttentionLayer, meta: AttentionMetadata) -> str:
    """The cheaper path by multiply-adds on the padded shapes (or the one meta forces).
    Prefills over cached context take the absorbed path: it reads the latent in tiles (no
    per-head K/V for the whole context). Batch-invariant steps reach here only with decode rows
    (prompt rows went to prefill.py) and take it too: a decode row reduces the same way alone,
    batched, or recomputed after a preemption."""
    if meta.path != "auto":
        return meta.path
    if meta.invariant or 1 < meta.max_query_len < meta.max_context_len:
        return "absorbed"
    b, q, length = meta.num_seqs, meta.max_query_len, meta.max_context_len
    h, r, dn, dr, dv = layer.n_heads, layer.kv_rank, layer.dn, layer.dr, layer.dv
    naive = b * length * r * h * (dn + dv) + b * q * length * h * (dn + dr + dv)
    absorbed = b * q * h * r * (dn + dv) + b * q * length * h * (2 * r + dr)
    return "absorbed" if absorbed <= naive else "naive"


class AttentionBackend:
    """Base class: the shared driver; subclasses give the three methods below."""

    name = "base"

    def forward(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        """-> [T, H, dv] in flat order; the layer has written this step's latents to cache (model/fused.py
        write_latent, the cache's one writer)."""
        if meta.groups is None:
            return self.attend(layer, q_nope, q_rope, cache, meta)
        out = q_nope.new_empty(q_nope.shape[0], layer.n_heads, layer.dv)
        self.attend_groups(layer, q_nope, q_rope, cache, meta.groups, out)
        return out

    def for_format(self, fmt) -> "AttentionBackend":
        """The backend that attends over a cache of this format (cache/format.py CacheFormat): this one, or
        one of its own for a format its kernels do not read."""
        return self

    def attend_groups(self, layer: AttentionLayer, q_nope, q_rope, cache, groups: list, out: torch.Tensor) -> None:
        """meta.groups' rows of the flat q_* [T,H,*] -> out[rows] [T,H,dv], group by group; a backend
        that attends several groups in one pass overrides it."""
        for rows, group in groups:
            out[rows] = self.attend(layer, q_nope[rows], q_rope[rows], cache, group)

    def attend(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        """One group: q_* [T,H,*] (flat, already in the cache) -> [T,H,dv]."""
        if meta.prompt_rows is not None:
            return self.attend_prompt(layer, q_nope, q_rope, cache, meta)
        single = meta.num_seqs == 1  # the flat batch already is the padded one
        if single:
            q_nope, q_rope = q_nope[None], q_rope[None]
        else:
            q_nope, q_rope = q_nope[meta.query_index], q_rope[meta.query_index]  # [B, Qmax, H, *]
        if choose_path(layer, meta) == "absorbed":
            out = self.absorbed_attention(layer, q_nope, q_rope, cache, meta)
        else:
            key, value = layer.expand(self.context(cache, meta))
            out = self.dense_attention(
                torch.cat((q_nope, layer.full_rope(q_rope)), dim=-1), key, value, meta, layer.scale
            )
        return out[0] if single else out[meta.query_valid]  # [T, H, dv], back in flat order

    def attend_prompt(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        """Batch-invariant, one sequence: its leading prompt rows by the invariant naive path, the
        rest (tokens decode produced, recomputed after a preemption) as decode computed them."""
        if meta.num_seqs != 1:
            raise ValueError("prompt rows attend one sequence at a time: build the metadata with split=True")
        n = meta.prompt_rows[0]
        out = self.prompt_attention(layer, q_nope[:n], q_rope[:n], cache, meta)
        if n == q_nope.shape[0]:
            return out
        rest = replace(
            meta,
            query_pos=meta.query_pos[:, n:],
            query_valid=meta.query_valid[:, n:],
            query_index=meta.query_index[:, n:] - n,
            max_query_len=meta.max_query_len - n,
            prompt_rows=None,
            groups=None,
            _masks={},
        )
        return torch.cat((out, self.attend(layer, q_nope[n:], q_rope[n:], cache, rest)))

    def prompt_attention(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        """One sequence's prompt rows q_nope [n,H,dn], q_rope [n,H,dr] -> [n,H,dv], batch-invariant
        (attention/prefill.py); a backend with a faster invariant kernel overrides it."""
        return invariant_prefill(layer, q_nope, q_rope, cache, meta)

    def absorbed_attention(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        """q_nope [B, Q, H, dn], q_rope [B, Q, H, *] (padded batch) -> [B, Q, H, dv] by the absorbed path:
        the latent query, latent_attention, W_UV."""
        o_lat = self.latent_attention(layer.absorb(q_nope, q_rope), cache, meta)
        return layer.unabsorb(o_lat, q_nope.shape[1])

    def latent_attention(self, query, cache, meta: AttentionMetadata) -> torch.Tensor:
        """query [B, Q*H, r+dr] (absorbed, scaled) -> o_lat [B, Q*H, r]; causal by meta.key_mask."""
        raise NotImplementedError

    def dense_attention(self, query, key, value, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [B,Q,H,D], key [B,L,H,D], value [B,L,H,dv] -> [B,Q,H,dv]."""
        raise NotImplementedError

    def context(self, cache, meta: AttentionMetadata) -> torch.Tensor:
        """-> the cached rows [B, L, r+dr] of the batch's sequences, in the model dtype."""
        raise NotImplementedError
