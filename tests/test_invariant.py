"""latentkv/invariant.py: row-invariant matmuls, checked on the machine that runs the suite."""
import torch

from latentkv import invariant


def test_float32_linears_are_row_invariant_on_this_machine():
    """The measured rule invariant.py relies on: with small row counts padded, every row of a float32
    linear has the same bits whatever M is (bf16 needs no padding)."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        w, x = torch.randn(96, 64, generator=gen).to(dtype), torch.randn(40, 64, generator=gen).to(dtype)
        full = invariant.linear(x, w)
        for m in range(1, 20):
            assert torch.equal(invariant.linear(x[3:3 + m], w), full[3:3 + m]), (dtype, m)
            assert torch.equal(invariant.bmm(x[None, 3:3 + m], w.T[None]), invariant.bmm(x[None], w.T[None])[:, 3:3 + m])


def test_one_row_bf16_linears_are_padded_to_the_kernel_every_other_m_takes():
    """oneDNN's one-row bf16 kernel rounds a few outputs per 10^5 differently from M >= 2: rare, so
    3000 rows of a K = 64 shape (the test models' projections), each alone vs in pairs."""
    gen = torch.Generator().manual_seed(0)
    w, x = (torch.randn(48, 64, generator=gen) * 0.02).bfloat16(), (torch.randn(3000, 64, generator=gen) * 2).bfloat16()
    pairs = torch.cat([invariant.linear(x[i:i + 2], w) for i in range(0, 3000, 2)])
    alone = torch.cat([invariant.linear(x[i:i + 1], w) for i in range(3000)])
    assert torch.equal(alone, pairs)
