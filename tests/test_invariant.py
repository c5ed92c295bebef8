"""latentkv/invariant.py: row-invariant matmuls, checked on the machine that runs the suite."""

import torch
from torch import nn

from latentkv import invariant
from latentkv.kernels import qlinear
from latentkv.model.quant import FixedOrderLinear
from latentkv.model.route import decide_route


def test_float32_linears_are_row_invariant_on_this_machine():
    """The measured rule invariant.py relies on: with small row counts padded, every row of a float32
    linear has the same bits whatever M is (bf16 needs no padding)."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        w, x = torch.randn(96, 64, generator=gen).to(dtype), torch.randn(40, 64, generator=gen).to(dtype)
        full = invariant.linear(x, w)
        for m in range(1, 20):
            assert torch.equal(invariant.linear(x[3 : 3 + m], w), full[3 : 3 + m]), (dtype, m)
            assert torch.equal(
                invariant.bmm(x[None, 3 : 3 + m], w.T[None]), invariant.bmm(x[None], w.T[None])[:, 3 : 3 + m]
            )


def test_one_row_bf16_linears_are_padded_to_the_kernel_every_other_m_takes():
    """oneDNN's one-row bf16 kernel rounds a few outputs per 10^5 differently from M >= 2: rare, so
    3000 rows of a K = 64 shape (the test models' projections), each alone vs in pairs."""
    gen = torch.Generator().manual_seed(0)
    w, x = (torch.randn(48, 64, generator=gen) * 0.02).bfloat16(), (torch.randn(3000, 64, generator=gen) * 2).bfloat16()
    pairs = torch.cat([invariant.linear(x[i : i + 2], w) for i in range(0, 3000, 2)])
    alone = torch.cat([invariant.linear(x[i : i + 1], w) for i in range(3000)])
    assert torch.equal(alone, pairs)


def linear_for(route, name: str, k: int, n: int, gen) -> nn.Module:
    """A linear as a model built for `route` holds it, random weights loaded and packed."""
    linear = route.linear(name, k, n, bias=True).to(route.dtype)
    with torch.no_grad():
        for p in linear.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    if hasattr(linear, "pack_weights"):
        linear.pack_weights()
    return linear


def test_the_engine_owns_its_model_so_its_float32_and_bf16_linears_take_the_fixed_order_kernel():
    """A batch-invariant route builds float32 and bf16 linears as FixedOrderLinear (where the kernel
    builds; kv_b_proj stays: the absorbed path reads its weight); install() then only hooks the
    rest, and never replaces a module (a model being trained keeps its autograd); rows agree alone
    and batched, for every M (oneDNN's bf16 kernels change with M on some CPUs: not relied on)."""
    gen = torch.Generator().manual_seed(1)
    f32, bf16 = (decide_route("cpu", dtype, batch_invariant=True) for dtype in (torch.float32, torch.bfloat16))
    assert f32.weights == bf16.weights == ("fixed-order" if qlinear.available() else "float")
    model = nn.ModuleDict(
        {
            "o_proj": linear_for(f32, "o_proj", 64, 48, gen),
            "kv_b_proj": linear_for(f32, "kv_b_proj", 64, 32, gen),
            "head": linear_for(bf16, "lm_head", 64, 40, gen),
        }
    )
    replaced = sum(isinstance(m, FixedOrderLinear) for m in model.values())
    assert replaced == (2 if qlinear.available() else 0)
    for name in ("o_proj", "head"):
        assert isinstance(model[name], FixedOrderLinear if qlinear.available() else nn.Linear)
    assert invariant.install(model) == 3 - replaced
    assert isinstance(model["kv_b_proj"], nn.Linear) and model["kv_b_proj"]._invariant_hooked
    with torch.no_grad():
        for name, dtype in (("o_proj", torch.float32), ("kv_b_proj", torch.float32), ("head", torch.bfloat16)):
            x = torch.randn(40, 64, generator=gen).to(dtype)
            full = model[name](x)
            assert all(torch.equal(model[name](x[i : i + 1]), full[i : i + 1]) for i in range(40)), name
            assert all(torch.equal(model[name](x[:m])[0], full[0]) for m in range(1, 40)), name


def test_install_keeps_a_trained_model_trainable():
    linear = nn.Linear(64, 48)
    model = nn.Sequential(linear)
    assert invariant.install(model) == 1 and model[0] is linear
    model(torch.randn(3, 64)).sum().backward()
    assert linear.weight.grad is not None
