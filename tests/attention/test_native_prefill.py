"""The native prefill kernel (csrc/mla_prefill_bf16.h, avx512_bf16) against float64 attention,
and its batch invariance: a row's bits do not depend on the span cuts, the rows beside it or the
threads (through the engine's span_prefill: tests/attention/test_invariant_prefill.py).

Tolerance, as error / max|exact output| (exact = float64 causal attention over the same bf16
queries and keys): 1e-2 — scores are exact bf16 products summed in float32, the probabilities
are rounded to bf16 (2^-9 relative) before the values, and the result once more to bf16 (2^-8).
"""
import pytest
import torch

from latentkv.attention import native

pytestmark = pytest.mark.skipif(not native.available() or "avx512_bf16" not in native.supported_isas(),
                                reason="the native prefill kernel needs the native build and avx512_bf16")
KERNEL_TOL = 1e-2


def exact(q, kv, k_r, dn, first, scale):
    """float64 causal attention of rows q [n,H,dn+dr] at first.. over keys 0..S-1 -> [n,H,dv]."""
    n, heads = q.shape[:2]
    key = torch.cat((kv[..., :dn], k_r[:, None].expand(-1, heads, -1)), -1).double()
    scores = torch.einsum("nhd,shd->hns", q.double(), key) * scale
    pos = torch.arange(first, first + n)[:, None]
    scores = scores.masked_fill(torch.arange(kv.shape[0])[None] > pos, float("-inf"))
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), kv[..., dn:].double())


def run(q, kv, k_r, dn, first, scale, cuts):
    """The kernel over key spans [cuts[i], cuts[i+1]) -> [n, H, dv] float32."""
    n, heads = q.shape[:2]
    m, l = torch.full((n, heads), float("-inf")), torch.zeros(n, heads)
    dv = kv.shape[-1] - dn
    acc = torch.zeros(n, heads, -(-dv // 16) * 16)
    for a, b in zip(cuts, cuts[1:]):
        native.mla_prefill(q, kv[a:b].contiguous(), k_r[a:b].contiguous(), dn, first, a, m, l, acc, scale)
    return acc[..., :dv] / l[..., None]


def inputs(n, keys, heads, dn, dr, dv, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, dn + dr, generator=gen).bfloat16()
    kv = torch.randn(keys, heads, dn + dv, generator=gen).bfloat16()
    return q, kv, torch.randn(keys, dr, generator=gen).bfloat16(), (dn + dr) ** -0.5


@pytest.mark.parametrize("heads,dn,dr,dv", [(1, 16, 8, 16), (3, 50, 96, 64), (16, 128, 64, 128), (2, 15, 0, 12),
                                            (128, 32, 32, 32), (4, 8, 8, 70)])
@torch.inference_mode()
def test_matches_float64_attention(heads, dn, dr, dv):
    n, keys, first = 203, 320, 100  # rows at 100..302: the last key block partly visible, keys past 302 unseen
    q, kv, k_r, scale = inputs(n, keys, heads, dn, dr, dv)
    got, want = run(q, kv, k_r, dn, first, scale, [0, keys]), exact(q, kv, k_r, dn, first, scale)
    assert (got.double() - want).abs().max() <= KERNEL_TOL * want.abs().max()


@torch.inference_mode()
def test_span_cuts_rows_and_threads_do_not_change_a_bit():
    q, kv, k_r, scale = inputs(300, 384, 3, 50, 96, 64, seed=1)
    whole = run(q, kv, k_r, 50, 84, scale, [0, 384])
    assert torch.equal(run(q, kv, k_r, 50, 84, scale, [0, 64, 256, 384]), whole)
    for a, b in [(0, 1), (1, 70), (70, 300), (299, 300)]:  # rows computed alone or in other groups
        assert torch.equal(run(q[a:b].contiguous(), kv, k_r, 50, 84 + a, scale, [0, 384]), whole[a:b]), (a, b)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run(q, kv, k_r, 50, 84, scale, [0, 384]), whole)
    finally:
        torch.set_num_threads(threads)


def test_bad_shapes_are_refused():
    q, kv, k_r, scale = inputs(4, 96, 2, 16, 8, 16)
    with pytest.raises(RuntimeError, match="key block"):
        run(q, kv, k_r, 16, 0, scale, [0, 96])
