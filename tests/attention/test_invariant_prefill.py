"""attention/prefill.py: the batch-invariant naive prefill.

Both implementations: "tiles" (SDPA on fixed query tiles, every CPU and dtype) and "native"
(span_prefill with the native kernel on each instruction set this CPU runs: float32 FMAs at the
ISA's width, bf16 dot products on avx512_bf16; skipped without the native build). A prompt row's
output must be bit-identical whether its prompt is prefilled whole, in chunks that end anywhere
(mid-tile, one row), or after a cached prefix — in bf16 and float32 and over
an int8 latent — on the machine that runs the suite (it relies on SDPA's CPU kernel rounding a
row the same in calls of the same shape). It must also agree with the plain naive path (one
causal SDPA call) within the dtype's tolerance, and steps are split so that each prompt attends
alone while decodes share a group.
"""

import functools

import pytest
import torch
from torch import nn

from latentkv.attention import prefill as prefill_module
from latentkv.attention.metadata import build_metadata
from latentkv.attention.paged import write
from latentkv.attention.prefill import FIRST_TILES, TILE, invariant_prefill, span_prefill, tiles
from latentkv.cache.latent_cache import LatentCache
from latentkv.kernels import attention as attention_kernels
from latentkv.kernels import qlinear
from latentkv.model import converted as converted_module
from latentkv.model.mla import MLAttention

BLOCK = 16
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # of the output's scale


class Layer(nn.Module):
    """What prefill.py calls back into: MLAttention's expand (kv_b_proj), softmax scale and rope
    groups (none: random query rows have no grouped structure; tests/model/test_rope_groups.py)."""

    expand, expand_latent, padded_kv_b = MLAttention.expand, MLAttention.expand_latent, MLAttention.padded_kv_b
    padded_expand = MLAttention.padded_expand
    full_rope, grouped_rope = MLAttention.full_rope, MLAttention.grouped_rope
    folded = False  # the shared rope query (no rope groups to fold)

    def rope_groups(self):
        return None

    def scores_nope(self):
        return True

    def kv_groups(self):
        return 1, None

    def __init__(self, heads=3, rank=32, dn=16, dr=8, dv=12, dtype=torch.float32):
        super().__init__()
        self.n_heads, self.kv_rank, self.dn, self.dr, self.dv = heads, rank, dn, dr, dv
        self._padded = (None, None, None)
        self.scale = (dn + dr) ** -0.5
        self.kv_b_proj = nn.Linear(rank, heads * (dn + dv), bias=False).to(dtype)
        nn.init.normal_(self.kv_b_proj.weight, std=rank**-0.5, generator=torch.Generator().manual_seed(4))


def prompt(length, layer, dtype, cache_dtype):
    """A cache holding one sequence's latents on out-of-order blocks (stale values elsewhere),
    and its queries q_nope [L, H, dn], q_rope [L, H, dr]."""
    gen = torch.Generator().manual_seed(0)
    need = -(-length // BLOCK)
    table = (torch.randperm(need + 3, generator=gen)[:need] + 1).tolist()
    cache = LatentCache(need + 4, BLOCK, layer.kv_rank, layer.dr, dtype, cache_dtype)
    if cache_dtype == "auto":
        cache.kv.normal_(generator=gen).mul_(50)
    pos = torch.arange(length)
    write(
        cache,
        torch.randn(length, layer.kv_rank, generator=gen).to(dtype),
        torch.randn(length, layer.dr, generator=gen).to(dtype),
        torch.tensor(table)[pos // BLOCK] * BLOCK + pos % BLOCK,
    )
    q_nope = torch.randn(length, layer.n_heads, layer.dn, generator=gen).to(dtype)
    q_rope = torch.randn(length, layer.n_heads, layer.dr, generator=gen).to(dtype)
    return cache, table, q_nope, q_rope


NATIVE = [f"native:{isa}" for isa in attention_kernels.supported_isas()]  # empty without the native build


def prefill(layer, cache, table, q_nope, q_rope, start, end, impl="tiles"):
    """Rows start .. end-1, computed in one step that ends at end (the cache holds 0 .. end-1)."""
    meta, _ = build_metadata([end - start], [end], [table], BLOCK, invariant=True, prompt_lens=[len(q_nope)])
    assert meta.prompt_rows == [end - start]
    if impl.startswith("native:"):
        kernel = functools.partial(attention_kernels.mla_prefill, path=impl.removeprefix("native:"))
        return span_prefill(layer, q_nope[start:end], q_rope[start:end], cache, meta, kernel)
    return invariant_prefill(layer, q_nope[start:end], q_rope[start:end], cache, meta)


def test_tiles_sit_at_fixed_positions():
    bounds = [0]
    for size in FIRST_TILES + (TILE,) * 3:
        bounds.append(bounds[-1] + size)
    every = list(zip(bounds, bounds[1:]))
    assert tiles(0, 1) == every[:1] and tiles(0, bounds[-1]) == every
    assert tiles(130, 600) == every[1:4] and tiles(511, 512) == [every[2]]


@pytest.mark.parametrize(
    "impl,dtype,cache_dtype",
    [("tiles", torch.bfloat16, "auto"), ("tiles", torch.float32, "auto"), ("tiles", torch.bfloat16, "int8")]
    + [
        (impl, dtype, cache_dtype)
        for impl in NATIVE
        for dtype, cache_dtype in [
            (torch.float32, "auto"),
            (torch.float32, "int8"),
            (torch.bfloat16, "auto"),
            (torch.bfloat16, "int8"),
        ]
    ],
)
@torch.inference_mode()
def test_a_prompt_row_is_the_same_whole_chunked_or_after_a_cached_prefix(monkeypatch, impl, dtype, cache_dtype):
    monkeypatch.setattr(prefill_module, "SPAN", 256)  # native: several key spans at this small size
    length = 1100  # the first tiles and two of TILE, the last partly filled
    layer = Layer(
        rank=40, dr=24, dtype=dtype
    )  # bf16 on AMX: kv_b_proj padded to 64 columns, the rope values in the pad
    cache, table, q_nope, q_rope = prompt(length, layer, dtype, cache_dtype)
    whole = prefill(layer, cache, table, q_nope, q_rope, 0, length, impl)
    for cuts in ([0, 100, 101, 256, 700, length], [0, 1, 512, 513, 1099, length], [0, 300, length]):
        chunks = [prefill(layer, cache, table, q_nope, q_rope, a, b, impl) for a, b in zip(cuts, cuts[1:])]
        assert torch.equal(torch.cat(chunks), whole), cuts


@pytest.mark.parametrize(
    "impl,dtype",
    [("tiles", torch.float32), ("tiles", torch.bfloat16)]
    + [(impl, dtype) for impl in NATIVE for dtype in (torch.float32, torch.bfloat16)],
)
@torch.inference_mode()
def test_matches_one_causal_sdpa_call_on_the_whole_expanded_context(impl, dtype):
    length, layer = 700, Layer(dtype=dtype)
    cache, table, q_nope, q_rope = prompt(length, layer, dtype, "auto")
    tiled = prefill(layer, cache, table, q_nope, q_rope, 0, length, impl).double()
    meta, _ = build_metadata([length], [length], [table], BLOCK)
    key, value = layer.expand(torch.cat([cache.kv[b] for b in table])[None, :length])
    plain = (
        torch.nn.functional.scaled_dot_product_attention(
            torch.cat((q_nope, q_rope), -1)[None].transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            is_causal=True,
            scale=layer.scale,
        )[0]
        .transpose(0, 1)
        .double()
    )
    assert (tiled - plain).abs().max() <= TOL[dtype] * plain.abs().max()


@torch.inference_mode()
def test_the_padded_kv_b_proj_is_kv_b_proj_whatever_the_rope_values(monkeypatch):
    """bf16 on AMX with a rank off the tile depth: kv_b_proj's weight zero-padded, the rope values
    read into the pad (times zero): kv_b_proj's values, unchanged by what the rope values are.
    (Both CPU kinds are set here, so every machine checks both.)"""
    rows = torch.randn(300, 64).bfloat16()
    monkeypatch.setattr(converted_module, "features", lambda: {"amx_bf16": False})
    layer = Layer(rank=40, dr=24, dtype=torch.bfloat16)
    assert layer.padded_kv_b() is None and torch.equal(layer.expand_latent(rows), layer.kv_b_proj(rows[:, :40]))
    monkeypatch.setattr(converted_module, "features", lambda: {"amx_bf16": True})
    assert layer.padded_kv_b().shape == (3 * 28, 64)
    got = layer.expand_latent(rows)
    want = layer.kv_b_proj(rows[:, :40]).float()
    assert (got.float() - want).abs().max() <= 2**-7 * want.abs().max()
    other = rows.clone()
    other[:, 40:] = torch.randn(300, 24).bfloat16() * 1e4
    assert torch.equal(layer.expand_latent(other), got)
    if qlinear.runs_amx():  # the tile kernel takes it: a row's bits whatever the rows beside it
        assert layer._padded[2] is not None
        for m in (1, 17, 37, 128):
            assert torch.equal(layer.expand_latent(rows[:m]), got[:m]), m
    assert Layer(rank=40, dr=8, dtype=torch.bfloat16).padded_kv_b() is None  # no room for the pad
    assert Layer(rank=64, dr=8, dtype=torch.bfloat16).padded_kv_b() is None  # on the grid already
    assert Layer(rank=40, dr=24).padded_kv_b() is None  # float32: MKL gains nothing


def test_each_prompt_attends_alone_and_decodes_together():
    # a prefill chunk, two decodes, a one-token rest of a prompt (after a prefix hit), a recompute
    qlens, ctxs = [5, 1, 1, 1, 6], [9, 20, 7, 13, 30]
    tables = [[i] * 2 for i in range(5)]
    meta, _ = build_metadata(qlens, ctxs, tables, BLOCK, invariant=True, prompt_lens=[9, 3, 3, 13, 27])
    assert meta.prompt_rows == [5, 0, 0, 1, 3]
    groups = [(torch.arange(64)[rows].tolist(), sub.prompt_rows) for rows, sub in meta.groups]
    assert groups == [([0, 1, 2, 3, 4], [5]), ([7], [1]), ([8, 9, 10, 11, 12, 13], [3]), ([5, 6], None)]
    # 16 equal prompts: equal lengths used to share one padded batch; invariant, each goes alone
    same, _ = build_metadata([4] * 16, [4] * 16, [[i] for i in range(16)], BLOCK, invariant=True)
    assert len(same.groups) == 16
    plain, _ = build_metadata([4] * 16, [4] * 16, [[i] for i in range(16)], BLOCK)
    assert plain.groups is None and plain.prompt_rows is None


@pytest.mark.parametrize("impl", NATIVE)
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, "auto"), (torch.bfloat16, "int8")])
@pytest.mark.parametrize("block", [16, 48])  # 48: spans and stops off the block grid (rows picked by index)
@torch.inference_mode()
def test_many_sequences_in_one_pass_are_each_alone(monkeypatch, impl, dtype, cache_dtype, block):
    """span_prefill_many (one read, expansion and rope-key call per span for all sequences) gives each
    sequence's rows the bits span_prefill gives them alone, whatever else shares the pass."""
    monkeypatch.setattr(prefill_module, "SPAN", 256)
    layer = Layer(rank=40, dr=24, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    # (prompt rows this step, cached prefix): one past a span, one after a cached prefix, one short
    seqs = [(300, 0), (90, 200), (7, 0)]
    need = [-(-(n + p) // block) for n, p in seqs]
    ids = (torch.randperm(sum(need) + 4, generator=gen) + 1).tolist()
    tables = [ids[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(seqs))]
    cache = LatentCache(sum(need) + 6, block, layer.kv_rank, layer.dr, dtype, cache_dtype)
    if cache_dtype == "auto":
        cache.kv.normal_(generator=gen).mul_(50)  # stale values past each context
    for (n, p), table in zip(seqs, tables):
        pos = torch.arange(n + p)
        write(
            cache,
            torch.randn(n + p, layer.kv_rank, generator=gen).to(dtype),
            torch.randn(n + p, layer.dr, generator=gen).to(dtype),
            torch.tensor(table)[pos // block] * block + pos % block,
        )
    total = sum(n for n, _ in seqs)
    q_nope = torch.randn(total, layer.n_heads, layer.dn, generator=gen).to(dtype)
    q_rope = torch.randn(total, layer.n_heads, layer.dr, generator=gen).to(dtype)
    kernel = functools.partial(attention_kernels.mla_prefill, path=impl.removeprefix("native:"))
    items, alone, at = [], [], 0
    for (n, p), table in zip(seqs, tables):
        meta, _ = build_metadata([n], [n + p], [table], block, invariant=True, prompt_lens=[n + p])
        items.append((slice(at, at + n), meta))
        alone.append(span_prefill(layer, q_nope[at : at + n], q_rope[at : at + n], cache, meta, kernel))
        tiled = invariant_prefill(layer, q_nope[at : at + n], q_rope[at : at + n], cache, meta).double()
        assert (alone[-1].double() - tiled).abs().max() <= TOL[dtype] * tiled.abs().max()  # the right rows read
        at += n
    together = torch.full((total, layer.n_heads, layer.dv), float("nan"), dtype=dtype)
    prefill_module.span_prefill_many(layer, q_nope, q_rope, cache, items, kernel, together)
    assert torch.equal(together, torch.cat(alone))
    finished = torch.full_like(together, float("nan"))  # the native last step: the same bits
    prefill_module.span_prefill_many(
        layer, q_nope, q_rope, cache, items, kernel, finished, attention_kernels.prefill_finish
    )
    assert torch.equal(finished, together)
    rev = torch.full_like(together, float("nan"))  # rows not one after another: gathered by index
    prefill_module.span_prefill_many(layer, q_nope, q_rope, cache, items[::-1], kernel, rev)
    assert torch.equal(rev, together)
