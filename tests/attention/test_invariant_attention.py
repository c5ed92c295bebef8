"""Batch invariance of latent attention, and prefill over cached context in bounded memory.

A row's output must be bit-identical whether it comes in a long prefill, a chunk after cached
context, a single-token decode, or beside other sequences (both backends). The tiled path must
agree with the one-pass reference within the dtype's tolerance (float32 2e-5, bf16 2e-2 of the
output's scale: the reference rounds scores and probabilities to bf16) and never allocate more
than a tile's worth, however long the context.
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from latentkv.attention import get_backend
from latentkv.attention.metadata import build_metadata
from latentkv.attention.paged import write
from latentkv.attention.torch_ref import KEY_TILE, QUERY_CHUNK, TorchBackend, tiled_latent_attention
from latentkv.cache.latent_cache import LatentCache

BLOCK = 16
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def filled(lengths, rank, rope, dtype, cache_dtype="auto", seed=0):
    """A cache with random latents for sequences of `lengths` on interleaved (out of order) blocks."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // BLOCK) for n in lengths]
    ids = torch.randperm(sum(need) + 2, generator=gen)[: sum(need)] + 1
    tables = [ids[sum(need[:i]) : sum(need[: i + 1])].tolist() for i in range(len(lengths))]
    cache = LatentCache(sum(need) + 3, BLOCK, rank, rope, dtype, cache_dtype)
    if cache_dtype == "auto":
        cache.kv.normal_(generator=gen).mul_(50)  # stale rows past each context must not leak
    for n, table in zip(lengths, tables):
        pos = torch.arange(n)
        slots = torch.tensor(table)[pos // BLOCK] * BLOCK + pos % BLOCK
        write(
            cache,
            (torch.randn(n, rank, generator=gen) * 2).to(dtype),
            torch.randn(n, rope, generator=gen).to(dtype),
            slots,
        )
    return cache, tables


def attend(backend, query, cache, qlens, ctxs, tables):
    """query rows [sum(qlens)*H, D] of sequences with qlens new tokens ending at ctxs -> [rows, r]."""
    meta, _ = build_metadata(qlens, ctxs, tables, BLOCK, invariant=True, split=False)
    heads = query.shape[0] // sum(qlens)
    flat = query.view(sum(qlens), heads, -1)
    padded = flat[meta.query_index].flatten(1, 2)  # [B, Qmax*H, D]
    out = backend.latent_attention(padded, cache, meta).view(len(qlens), meta.max_query_len, heads, -1)
    return out[meta.query_valid].flatten(0, 1)


@pytest.mark.parametrize(
    "dtype,cache_dtype", [(torch.bfloat16, "auto"), (torch.float32, "auto"), (torch.bfloat16, "int8")]
)
def test_a_row_is_the_same_in_prefill_chunk_decode_and_batch(attention_backend, dtype, cache_dtype):
    heads, rank, rope = 3, 32, 8
    length = KEY_TILE + 45  # two key tiles, the second partly filled
    cache, tables = filled([length, 70, 300], rank, rope, dtype, cache_dtype)
    backend = get_backend(attention_backend)
    gen = torch.Generator().manual_seed(1)
    query = (torch.randn(length * heads, rank + rope, generator=gen) * 0.3).to(dtype)
    whole = attend(backend, query, cache, [length], [length], tables[:1])  # prefill from scratch
    rows = lambda a, b: query[a * heads : b * heads]  # noqa: E731
    tail = attend(backend, rows(200, length), cache, [length - 200], [length], tables[:1])  # after a cached prefix
    assert torch.equal(tail, whole[200 * heads :])
    for p in (0, 15, 16, KEY_TILE - 1, KEY_TILE, length - 1):  # decodes, alone and beside others
        alone = attend(backend, rows(p, p + 1), cache, [1], [p + 1], tables[:1])
        assert torch.equal(alone, whole[p * heads : (p + 1) * heads]), p
        other = torch.randn(2 * heads, rank + rope, generator=gen).to(dtype)
        batched = attend(
            backend,
            torch.cat((other[:heads], rows(p, p + 1), other[heads:])),
            cache,
            [1, 1, 1],
            [70, p + 1, 300],
            [tables[1], tables[0], tables[2]],
        )
        assert torch.equal(batched[heads : 2 * heads], alone), p
    mixed = attend(backend, torch.cat((rows(250, 260), other[:heads])), cache, [10, 1], [260, 70], tables[:2])
    assert torch.equal(mixed[: 10 * heads], whole[250 * heads : 260 * heads])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_prefill_over_cached_context_matches_the_one_pass_reference(dtype):
    heads, rank, rope = 4, 32, 8
    length, cached = 2 * KEY_TILE + QUERY_CHUNK + 37, KEY_TILE + 3  # several key tiles and query chunks
    cache, tables = filled([length], rank, rope, dtype)
    query = (
        torch.randn(1, (length - cached) * heads, rank + rope, generator=torch.Generator().manual_seed(2)) * 0.3
    ).to(dtype)
    meta, _ = build_metadata([length - cached], [length], tables, BLOCK)
    tiled = tiled_latent_attention(query, cache, meta).double()
    whole = TorchBackend().whole_latent_attention(query, cache, meta).double()
    assert (tiled - whole).abs().max() <= TOL[dtype] * whole.abs().max()


def largest_allocation(fn) -> int:
    """Bytes of the largest single tensor allocation made while fn runs (torch's profiler)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.cpu_memory_usage for e in prof.events())


@torch.inference_mode()
def test_prefill_over_a_long_cached_context_allocates_only_tiles():
    heads, rank, rope, dtype = 4, 64, 16, torch.float32
    cached, new = 8 * KEY_TILE, QUERY_CHUNK  # a long prefix hit, then one chunk of prompt
    cache, tables = filled([cached + new], rank, rope, dtype)
    query = torch.randn(1, new * heads, rank + rope)
    meta, _ = build_metadata([new], [cached + new], tables, BLOCK)
    tile = 4 * QUERY_CHUNK * heads * max(KEY_TILE, rank + rope)  # one [B, QUERY_CHUNK*H, KEY_TILE] float32
    assert largest_allocation(lambda: tiled_latent_attention(query, cache, meta)) <= tile
    # the one-pass path materializes scores for the whole context: the bound is a real one
    assert largest_allocation(lambda: TorchBackend().whole_latent_attention(query, cache, meta)) > 4 * tile
