"""The native prefill kernels against float64 attention, on every instruction set this CPU runs:
float32 FMAs at the ISA's vector width (csrc/mla_prefill_f32.h: 4 lanes scalar/sse2, 8 avx2, 16
avx512; bf16 tensors widened) and bf16 dot products (csrc/mla_prefill_bf16.h, bf16 on avx512_bf16;
on AMX tiles, mla_prefill_amx.h).
Also their batch invariance: a row's bits do not depend on the span cuts, the rows beside it or
the threads (through the engine's span_prefill: tests/attention/test_invariant_prefill.py).

Tolerance, as error / max|exact output| (exact = float64 causal attention over the same queries
and keys): float32 kernel 1e-5 — scores and probabilities in float32, e^x by a ~2 ulp polynomial;
bf16 kernel 1e-2 — scores are exact bf16 products summed in float32, the probabilities are
rounded to bf16 (2^-9 relative) before the values, and the result once more to bf16 (2^-8).
"""

import pytest
import torch

from latentkv.kernels import attention as attention_kernels

pytestmark = pytest.mark.skipif(not attention_kernels.available(), reason="the native build is not available here")
ISAS = attention_kernels.supported_isas()
DTYPES = [torch.float32, torch.bfloat16]


def tolerance(isa, dtype):
    return 1e-2 if isa not in attention_kernels.FLOAT_PATHS and dtype == torch.bfloat16 else 1e-5


def exact(q, kv, k_r, dn, first, scale):
    """float64 causal attention of rows q [n,H,dn+dr] at first.. over keys 0..S-1 -> [n,H,dv];
    k_r [S, dr] (every head's) or [S, G, dr] (one per group of H / G consecutive heads)."""
    n, heads = q.shape[:2]
    rope = k_r[:, None].expand(-1, heads, -1) if k_r.dim() == 2 else k_r.repeat_interleave(heads // k_r.shape[1], 1)
    key = torch.cat((kv[..., :dn], rope), -1).double()
    scores = torch.einsum("nhd,shd->hns", q.double(), key) * scale
    pos = torch.arange(first, first + n)[:, None]
    scores = scores.masked_fill(torch.arange(kv.shape[0])[None] > pos, float("-inf"))
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), kv[..., dn:].double())


def run(q, kv, k_r, dn, first, scale, cuts, isa, state=None):
    """The kernel over key spans [cuts[i], cuts[i+1]) -> [n, H, dv] float32. state: what m, l and acc
    hold before the first span (None: the running state's start, -inf, 0, 0; the kernel starts it
    itself at key 0 whatever they hold)."""
    n, heads = q.shape[:2]
    m, l = torch.full((n, heads), float("-inf")), torch.zeros(n, heads)
    dv = kv.shape[-1] - dn
    acc = torch.zeros(n, heads, -(-dv // 16) * 16)
    if state is not None:
        for t in (m, l, acc):
            t.fill_(state)
    for a, b in zip(cuts, cuts[1:]):
        attention_kernels.mla_prefill(
            q, kv[a:b].contiguous(), k_r[a:b].contiguous(), dn, first, a, m, l, acc, scale, path=isa
        )
    return acc[..., :dv] / l[..., None]


def inputs(n, keys, heads, dn, dr, dv, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, dn + dr, generator=gen).to(dtype)
    kv = torch.randn(keys, heads, dn + dv, generator=gen).to(dtype)
    return q, kv, torch.randn(keys, dr, generator=gen).to(dtype), (dn + dr) ** -0.5


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads,dn,dr,dv",
    [
        (1, 16, 8, 16),
        (3, 50, 96, 64),
        (16, 128, 64, 128),
        (2, 15, 0, 12),
        (128, 32, 32, 32),
        (4, 8, 8, 70),
        (5, 17, 7, 33),
        (9, 64, 96, 64),
    ],
)
@torch.inference_mode()
def test_matches_float64_attention(isa, dtype, heads, dn, dr, dv):
    n, keys, first = 203, 320, 100  # rows at 100..302: the last key block partly visible, keys past 302 unseen
    q, kv, k_r, scale = inputs(n, keys, heads, dn, dr, dv, dtype)
    got, want = run(q, kv, k_r, dn, first, scale, [0, keys], isa), exact(q, kv, k_r, dn, first, scale)
    assert (got.double() - want).abs().max() <= tolerance(isa, dtype) * want.abs().max()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads,groups,dn,dr,dv",
    [(9, 3, 2, 64, 64), (9, 3, 0, 64, 64), (6, 2, 50, 32, 64), (4, 4, 15, 8, 33), (8, 2, 64, 96, 64), (4, 2, 0, 8, 16)],
)
@torch.inference_mode()
def test_grouped_rope_keys_match_float64_attention(isa, dtype, heads, groups, dn, dr, dv):
    # k_r [S, G, dr]: consecutive heads share one rope key (model/rope_groups.py; SmolLM2's conversion
    # is the first shape, the second without its zero nope part); AMX reads them in place (dr a
    # multiple of 32) or packs them
    n, keys, first = 150, 256, 120
    q, kv, _, scale = inputs(n, keys, heads, dn, dr, dv, dtype)
    k_r = torch.randn(keys, groups, dr, generator=torch.Generator().manual_seed(5)).to(dtype)
    got, want = run(q, kv, k_r, dn, first, scale, [0, 128, keys], isa), exact(q, kv, k_r, dn, first, scale)
    assert (got.double() - want).abs().max() <= tolerance(isa, dtype) * want.abs().max()
    shared = run(q, kv, k_r[:, :1].expand(-1, groups, -1), dn, first, scale, [0, keys], isa)
    assert torch.equal(
        shared, run(q, kv, k_r[:, 0], dn, first, scale, [0, keys], isa)
    )  # one group's key: the shared form


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads,kv_heads,groups,dn,dr,dv",
    [(9, 3, 3, 0, 64, 64), (9, 3, 3, 2, 64, 64), (6, 2, 1, 16, 32, 48), (4, 2, 2, 15, 8, 33)],
)
@pytest.mark.parametrize(
    "rows", [40, 300]
)  # one work item a head (AMX packs values inside it) / several (packed first)
@torch.inference_mode()
def test_kv_rows_per_group_give_the_bits_of_the_rows_repeated_per_head(
    isa, dtype, heads, kv_heads, groups, dn, dr, dv, rows
):
    # kv [S, Hk, dn + dv]: consecutive heads with equal kv_b_proj rows read one row (MLAttention.kv_groups;
    # SmolLM2's conversion: its values per source KV head, the first two shapes)
    q, _, _, scale = inputs(rows, 256, heads, dn, dr, dv, dtype, seed=6)
    gen = torch.Generator().manual_seed(7)
    kv = torch.randn(256, kv_heads, dn + dv, generator=gen).to(dtype)
    k_r = torch.randn(256, groups, dr, generator=gen).to(dtype)
    repeated = kv.repeat_interleave(heads // kv_heads, 1).contiguous()
    got = run(q, kv, k_r, dn, 200, scale, [0, 128, 256], isa)
    assert torch.equal(got, run(q, repeated, k_r, dn, 200, scale, [0, 128, 256], isa))
    want = exact(q, repeated, k_r, dn, 200, scale)
    assert (got.double() - want).abs().max() <= tolerance(isa, dtype) * want.abs().max()


@pytest.mark.parametrize("isa", ISAS)
@torch.inference_mode()
def test_a_long_context_in_spans_with_large_scores(isa):
    # scores ~ +-30: the running max moves often, every rescale must hold; the rows start past
    # the first span (cached context), the prompt ends mid-block
    q, kv, k_r, _ = inputs(150, 1216, 4, 33, 32, 48, torch.float32, seed=3)
    first, scale = 1000, 0.6
    got = run(q, kv, k_r, 33, first, scale, [0, 512, 1024, 1216], isa)
    want = exact(q, kv[:1150], k_r[:1150], 33, first, scale)
    assert (got.double() - want).abs().max() <= tolerance(isa, torch.float32) * want.abs().max()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "dn,dr", [(50, 40), (50, 96), (64, 32)]
)  # AMX: keys packed / read in place, over the values / not
@torch.inference_mode()
def test_span_cuts_rows_and_threads_do_not_change_a_bit(isa, dtype, dn, dr):
    # rows alone or a few (one work item a head: AMX packs each block's values inside it) and many
    # (values packed once for all items first): the same bits
    q, kv, k_r, scale = inputs(300, 384, 3, dn, dr, 64, dtype, seed=1)
    whole = run(q, kv, k_r, dn, 84, scale, [0, 384], isa)
    assert torch.equal(run(q, kv, k_r, dn, 84, scale, [0, 64, 256, 384], isa), whole)
    for a, b in [(0, 1), (1, 70), (70, 300), (299, 300), (200, 232)]:  # rows computed alone or in other groups
        assert torch.equal(run(q[a:b].contiguous(), kv, k_r, dn, 84 + a, scale, [0, 384], isa), whole[a:b]), (a, b)
    for junk in (float("nan"), 7.0):  # the first span never reads the state it is handed
        assert torch.equal(run(q, kv, k_r, dn, 84, scale, [0, 64, 256, 384], isa, state=junk), whole), junk
    threads = torch.get_num_threads()
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            assert torch.equal(run(q, kv, k_r, dn, 84, scale, [0, 384], isa), whole), t
    finally:
        torch.set_num_threads(threads)


def test_bad_shapes_are_refused():
    q, kv, k_r, scale = inputs(4, 96, 2, 16, 8, 16)
    with pytest.raises(RuntimeError, match="key block"):
        run(q, kv, k_r, 16, 0, scale, [0, 96], ISAS[-1])
    with pytest.raises(RuntimeError, match="one dtype"):
        run(q.float(), kv, k_r, 16, 0, scale, [0, 64], ISAS[-1])
    with pytest.raises(RuntimeError, match="shapes do not match"):  # 3 rope keys for 2 heads
        run(q, kv, k_r[:, None].expand(-1, 3, -1), 16, 0, scale, [0, 64], ISAS[-1])
