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
