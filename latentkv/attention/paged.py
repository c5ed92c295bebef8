"""Reads and writes of the paged latent cache (`LatentCache` is the storage; this is the layout).

A token at flat slot s lives in block s // block_size, row s % block_size. Reads return
`[c ; k_r]` rows `[*, L, kv_rank + rope_dim]` in the model dtype, dequantized when the
latent is stored quantized. A transform-coded cache (cache/coded.py) is written at the tokens' RoPE
angles and read by position: a block at column j of a block table holds positions j * block_size ...,
so each reader passes the positions of the blocks it reads.
"""

from __future__ import annotations

import torch

from ..cache import coded, q4
from ..cache.latent_cache import LatentCache, quantize_latent


def write(
    cache: LatentCache,
    c: torch.Tensor,
    k_r: torch.Tensor,
    slot_mapping: torch.Tensor,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Store c [T, kv_rank] and k_r [T, rope_dim] (after RoPE) at flat slots [T]; angles: the tokens'
    RoPE cos, sin [T, rope_dim / 2] (a transform-coded cache turns its rope key's mean by them)."""
    if cache.format.coded:
        if angles is None:
            raise ValueError("a transform-coded cache is written with the tokens' RoPE angles")
        codes, scales = coded.encode(cache.format.code, c, k_r, *angles)
        slots = cache.latent.shape[0] * cache.block_size
        cache.latent.view(slots, -1).index_copy_(0, slot_mapping, codes)
        cache.scale.view(slots, -1).index_copy_(0, slot_mapping, scales)
        return
    if not cache.quantized:
        rows = cache.kv.view(-1, cache.kv.shape[-1])
        rows.index_copy_(0, slot_mapping, torch.cat((c, k_r), dim=-1).to(cache.dtype))
        return
    slots = cache.latent.shape[0] * cache.block_size  # not view(-1, width): with a width of 0 the -1 is ambiguous
    if cache.q4:
        codes, scale = q4.quantize(c)
        rope_codes, rope_scale = q4.quantize(q4.turn(k_r))
        cache.latent.view(slots, -1).index_copy_(0, slot_mapping, codes)
        cache.rope.view(slots, -1).index_copy_(0, slot_mapping, rope_codes)
        cache.scale.view(slots, -1).index_copy_(0, slot_mapping, torch.cat((scale, rope_scale), dim=-1))
        return
    q, scale = quantize_latent(c, cache.latent_dtype)
    cache.latent.view(-1, cache.kv_rank).index_copy_(0, slot_mapping, q)
    if cache.rope8:
        k_r, rope_scale = quantize_latent(k_r, "int8") if cache.rope_dim else (k_r, torch.ones_like(scale))
        scale = torch.stack((scale, rope_scale), dim=-1)
    cache.scale.view(slots, -1).index_copy_(0, slot_mapping, scale.view(len(slot_mapping), -1))
    cache.rope.view(slots, cache.rope_dim).index_copy_(0, slot_mapping, k_r.to(cache.rope.dtype))


def gather(cache: LatentCache, block_tables: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """block_tables [B, nb] -> [B, nb*block_size, kv_rank + rope_dim] in the model dtype (a copy);
    positions [B or 1, nb*block_size]: of the rows (None: the tables' columns from 0), what a
    transform-coded cache reads by."""
    b, nb = block_tables.shape
    ids = block_tables.reshape(-1)  # index_select copies whole rows; advanced indexing was ~6x slower
    if not cache.quantized:
        return cache.kv.index_select(0, ids).view(b, nb * cache.block_size, -1)
    if cache.format.coded and positions is None:
        positions = torch.arange(nb * cache.block_size, device=ids.device)[None]
    if positions is not None:
        positions = positions.expand(b, -1).reshape(b * nb, cache.block_size)
    kv = cache.dequantize(*(t.index_select(0, ids) for t in cache.tensors()), positions=positions)
    return kv.view(b, nb * cache.block_size, -1)


def read_positions(
    cache: LatentCache, block_tables: torch.Tensor, context_lens: torch.Tensor, start: int, stop: int
) -> torch.Tensor:
    """Positions start .. stop-1 of every sequence -> [B, stop - start, r+dr] in the model dtype,
    zero rows past a sequence's context (stale or unwritten slots must not reach a product with 0).
    Whole blocks are gathered (one row copy per block, not per token) and the rows past each
    context zeroed in place: a per-token gather and an out-of-place mask were a sixth of a
    restored 4K prefix's prefill."""
    bs = cache.block_size
    first = start // bs
    cols = torch.arange(first, -(-stop // bs), device=block_tables.device).clamp(max=block_tables.shape[1] - 1)
    positions = None
    if cache.format.coded:
        positions = torch.arange(first * bs, first * bs + len(cols) * bs, device=block_tables.device)[None]
    rows = gather(cache, block_tables[:, cols], positions)[:, start - first * bs : stop - first * bs]
    for i, length in enumerate(context_lens.tolist()):
        if length < stop:
            rows[i, max(length - start, 0) :] = 0
    return rows


def read_spans(cache: LatentCache, metas: list, start: int, stops: list[int]) -> torch.Tensor:
    """Positions start .. stops[i]-1 of each one-sequence metadata in `metas`, one sequence after
    another -> [sum(stops) - len(metas) * start, r+dr] in the model dtype, zero rows past each
    context (as read_positions): one gather and one dequantization for them all. Which blocks and
    rows is worked out once per step (kept in the first metadata's cache of masks)."""
    key = ("spans", start, tuple(stops), tuple(id(m) for m in metas))
    if key not in metas[0]._masks:
        bs, first = cache.block_size, start // cache.block_size
        ids, pick, zero, off, cols_read = [], [], [], 0, []
        for meta, stop in zip(metas, stops):
            table, length = meta.block_tables[0].tolist(), int(meta.context_lens[0])
            cols = range(first, -(-stop // bs))
            pick.append(len(ids) * bs + start - first * bs)  # where this sequence's rows begin in its blocks
            ids += [table[min(col, len(table) - 1)] for col in cols]
            cols_read += cols
            if length < stop:
                zero.append((off + max(length - start, 0), off + stop - start))
            off += stop - start
        aligned = start % bs == 0 and all(s % bs == 0 for s in stops)
        index = None if aligned else torch.cat([torch.arange(p, p + s - start) for p, s in zip(pick, stops)])
        device = metas[0].block_tables.device
        positions = (torch.tensor(cols_read, device=device)[:, None] * bs + torch.arange(bs, device=device)).view(1, -1)
        metas[0]._masks[key] = (torch.tensor(ids, device=device), index, zero, positions)
    ids, index, zero, positions = metas[0]._masks[key]
    rows = gather(cache, ids[None], positions)[0]
    if index is not None:
        rows = rows.index_select(0, index)
    for a, b in zero:
        rows[a:b] = 0
    return rows


def pieces(cache: LatentCache, runs: list[tuple[int, int]], length: int) -> list[torch.Tensor]:
    """One sequence's first `length` tokens, stored on `runs` of consecutive blocks ->
    [1, L_i, kv_rank + rope_dim] pieces in order, summing to `length`. Unquantized,
    each piece is a view: decode reads the cache once, with no gather copy."""
    out, left = [], length
    for first, count in runs:
        take = min(left, count * cache.block_size)
        if take <= 0:
            break
        if cache.quantized:
            blocks, at = slice(first, first + count), length - left  # the run's first position
            positions = None
            if cache.format.coded:
                positions = torch.arange(at, at + count * cache.block_size, device=cache.latent.device)
                positions = positions.view(count, cache.block_size)
            kv = cache.dequantize(*(t[blocks] for t in cache.tensors()), positions=positions)
        else:
            kv = cache.kv[first : first + count]
        out.append(kv.view(1, count * cache.block_size, -1)[:, :take])
        left -= take
    return out
