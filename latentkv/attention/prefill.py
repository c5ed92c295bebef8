"""Batch-invariant prefill: prompt rows take the naive path (keys and values expanded from the
latent read back from the cache, SDPA's flash kernel) in query tiles at fixed absolute positions.

Why tiles: SDPA's CPU kernel blocks its queries by how many there are and stops a causal row's
keys where its query block ends, so one row of a whole prefill and the same row of a chunk after
cached context would round differently. Here every call has a shape fixed by the tile alone:
the tile's rows [a, b) (rows this step does not compute are zero queries, their outputs dropped)
against keys [0, b) under the causal mask. A row's bits then depend only on its position, its
own query and the cache, never on the chunking, the prompt's length or the batch
(tests/attention/test_invariant_prefill.py checks it on the machine that runs the suite).
The keys are read back from the cache after this step's writes, so a chunk sees exactly the
latents (incl. int8 / fp8 ones) a whole prefill sees.

`span_prefill` is the same contract with a native kernel (attention/native_backend.py: float32 on every
CPU, bf16 on avx512_bf16): keys expanded SPAN positions at a time at fixed absolute spans, each
span folded into every row's online-softmax state by the kernel, so memory is bounded by the
span, never the context.

Decode rows (generated tokens) keep the absorbed kernel: the engine computes a token that
decode produced the same way if it is recomputed (attention/backend.py), and registers only
prompt-computed blocks for prefix caching (engine/kv_manager.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layer_api import AttentionLayer
from .metadata import AttentionMetadata
from .paged import read_positions, read_spans

FIRST_TILES = (128, 128, 256)  # a short prompt pads to at most 128 query rows
TILE = 512  # from position 512 on; larger tiles call SDPA less often, smaller ones pad less
SPAN = 2048  # keys span_prefill expands at once (a multiple of MIN_ROWS and of the kernel's 64-key blocks)
MIN_ROWS = 128  # fewest rows per kv_b_proj call: smaller float32 calls take MKL's small-M kernels


def tiles(first: int, last: int) -> list[tuple[int, int]]:
    """The fixed query tiles [a, b) that hold positions first .. last - 1."""
    out, a, sizes = [], 0, iter(FIRST_TILES)
    while a < last:
        b = a + next(sizes, TILE)
        if b > first:
            out.append((a, b))
        a = b
    return out


def invariant_prefill(
    layer: AttentionLayer, q_nope: torch.Tensor, q_rope: torch.Tensor, cache, meta: AttentionMetadata
) -> torch.Tensor:
    """One sequence's prompt rows q_nope [n, H, dn], q_rope [n, H, dr] at positions
    meta.query_pos[0, :n] (consecutive) -> [n, H, dv]."""
    n, heads = q_nope.shape[:2]
    first = int(meta.query_pos[0, 0])
    spans = tiles(first, first + n)
    base, end = spans[0][0], spans[-1][1]
    # up to the last tile's end (zero latents past the context): at least MIN_ROWS rows, so a
    # float32 kv_b_proj never takes MKL's small-M kernels, which round differently (latentkv/invariant.py)
    key, value = layer.expand(read_positions(cache, meta.block_tables, meta.context_lens, 0, end))
    dv, width = value.shape[-1], key.shape[-1]
    # head-major once, so each tile's keys are a view; SDPA's flash kernels need v as wide as q
    # and k (else the math path, several times slower)
    key = key.transpose(1, 2).contiguous()  # [1, H, end, D]
    value = F.pad(value, (0, width - dv)).transpose(1, 2).contiguous()
    query = q_nope.new_zeros(1, heads, end - base, width)  # rows not computed now stay zero queries
    query[0, :, first - base : first + n - base] = torch.cat((q_nope, layer.full_rope(q_rope)), dim=-1).transpose(0, 1)
    out = q_nope.new_empty(n, heads, dv)
    for a, b in spans:
        lo, hi = max(a, first), min(b, first + n)  # the rows of this tile computed now
        o = F.scaled_dot_product_attention(
            query[:, :, a - base : b - base],
            key[:, :, :b],
            value[:, :, :b],
            attn_mask=causal_mask(a, b, query.dtype, query.device),
            scale=layer.scale,
        )
        out[lo - first : hi - first] = o[0, :, lo - a : hi - a, :dv].transpose(0, 1)
    return out


def causal_mask(a: int, b: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[b - a, b] additive mask of query rows a .. b-1 over keys 0 .. b-1: 0 where key <= row, else -inf."""
    mask = torch.zeros(b - a, b, dtype=dtype, device=device)
    mask[:, a:].masked_fill_(torch.ones(b - a, b - a, dtype=torch.bool, device=device).triu_(1), float("-inf"))
    return mask


def span_prefill(
    layer: AttentionLayer,
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache,
    meta: AttentionMetadata,
    kernel,
    finish=None,
) -> torch.Tensor:
    """invariant_prefill's contract (-> [n, H, dv]) by `kernel(q [n,H,dn+dr], kv [S,H,dn+dv] or [S,Hk,dn+dv],
    k_r [S,dr] or [S,G,dr'] (grouped rope keys: q's rope part dr' wide), dn, first, key_start, m, l, acc,
    scale)`, which folds one span of keys into each
    row's float32 state (running max m [n,H], sum l [n,H], output acc [n,H,dv padded to a
    multiple of 16: the kernel's vector width]) in place, starting it afresh at key_start 0.
    Spans sit at fixed positions [k*SPAN, (k+1)*SPAN), the last one cut at a multiple of
    MIN_ROWS past the prompt (zero latents there; no row sees them). `finish(acc, l, out)`, where
    given, writes acc / l into out in one pass (else torch's ops, the same bits)."""
    out = q_nope.new_empty(q_nope.shape[0], layer.n_heads, layer.dv)
    span_prefill_many(layer, q_nope, q_rope, cache, [(slice(0, q_nope.shape[0]), meta)], kernel, out, finish)
    return out


def span_prefill_many(
    layer: AttentionLayer,
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    cache,
    items: list,
    kernel,
    out: torch.Tensor,
    finish=None,
) -> None:
    """span_prefill for several sequences: items [(rows: a slice of the flat q_nope [T,H,dn] /
    q_rope [T,H,dr], the metadata of that one sequence, whose rows are all prompt rows)] ->
    out[rows] [n,H,dv]. Per span, every sequence's latent rows are read, expanded and their rope
    keys grouped in one call each, all row by row (each row's bits as read alone: the batch
    invariance holds), then the kernel folds each sequence's keys into its rows."""
    heads, dv = layer.n_heads, layer.dv
    groups = layer.rope_groups()  # a converted GQA model's rope key un-mixed per group (model/rope_groups.py)
    dn = layer.dn if layer.scores_nope() else 0  # a zero W_UK: no nope part in the scores
    per, expand = layer.kv_groups()  # heads sharing kv rows (a converted GQA model's values): one row each
    follow = all(a.stop == b.start for (a, _), (b, _) in zip(items, items[1:]))
    rows = (
        slice(items[0][0].start, items[-1][0].stop)
        if follow
        else torch.cat([torch.arange(r.start, r.stop, device=q_nope.device) for r, _ in items])
    )
    q_rope = layer.grouped_rope(q_rope[rows])  # the queries in each group's basis, as the keys below
    q = (torch.cat((q_nope[rows], q_rope), dim=-1) if dn else q_rope).contiguous()
    # the kernel starts each row's state itself at the first span (key_start 0)
    m, l = torch.empty(q.shape[:2]), torch.empty(q.shape[:2])
    acc = torch.empty(*q.shape[:2], -(-dv // 16) * 16)
    seqs, at = [], 0  # (its first row in q, rows, first position, end)
    for r, meta in items:
        first = int(meta.query_pos[0, 0])
        seqs.append((at, r.stop - r.start, first, first + r.stop - r.start))
        at += r.stop - r.start
    for start in range(0, max(s[3] for s in seqs), SPAN):
        live = [i for i, s in enumerate(seqs) if s[3] > start]
        stops = [min(start + SPAN, -(-seqs[i][3] // MIN_ROWS) * MIN_ROWS) for i in live]
        latent = read_spans(cache, [items[i][1] for i in live], start, stops)
        if expand is not None:
            kv = expand(latent[:, : layer.kv_rank]).view(-1, heads // per, dn + dv)
        else:
            kv = layer.expand_latent(latent).view(-1, heads, layer.dn + dv)
            kv = kv if dn else kv[..., layer.dn :].contiguous()
        k_r = latent[:, layer.kv_rank :]
        k_r = groups.keys(k_r) if groups else k_r.contiguous()
        key = 0
        for i, stop in zip(live, stops):
            a, n, first, _ = seqs[i]
            kernel(
                q[a : a + n],
                kv[key : key + stop - start],
                k_r[key : key + stop - start],
                dn,
                first,
                start,
                m[a : a + n],
                l[a : a + n],
                acc[a : a + n],
                layer.scale,
            )
            key += stop - start
    if finish is not None and isinstance(rows, slice):
        finish(acc, l, out[rows])
    else:
        out[rows] = (acc[..., :dv] / l[..., None]).to(q.dtype)
