"""The integer-dot w4a8 / w8a8 linears (kernels/qlinear.py dot_linear, kernels/csrc/qlinear/qlinear_dot_impl.h) against
a PyTorch reference of the same quantization math, on every instruction set this CPU runs.

The activation codes, d_x, s_x and the codes' sums must equal the reference exactly (one IEEE
operation each). Paths that need avx512_vnni run the vpdpbusd path (qlinear_dot_vnni.h), the others
with avx2 the AVX2 path (test_each_isa_runs_its_dot_path). The
output: each group's integer dot product is exact and the kernel adds G groups' terms
float(isum) * fl(d_w * d_x) (+ m_w * s_x) into one float32 total with fmas, so it may differ from the
float64 sum of the same terms by at most 2 G rounding errors of 2^-24 of the terms' absolute sum:
|error| <= G * 2^-23 * sum |terms|. bf16 outputs are rounded once more (2^-8 relative)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentkv.kernels import build, qlinear
from latentkv.model.quant import (
    Int4Linear,
    Int8Linear,
    W4A8G128Linear,
    W4A8Linear,
    W8A8Linear,
    dequantize_int4,
    quantize_int4,
    quantize_int8,
)
from latentkv.model.route import decide_route
from threads import torch_threads

pytestmark = pytest.mark.skipif(not qlinear.available(), reason=f"qlinear not built: {qlinear.unavailable_reason()}")


ALL = ["scalar", *build.CAPS]  # every path name (those this CPU lacks skip)
# each integer-dot format: (weight bits, inputs per group, record kind)
FORMATS = {
    "w4a8": (4, 32, qlinear.ACT8 + 4),
    "w4a8_g128": (4, qlinear.G128, qlinear.W4A8_G128),
    "w8a8": (8, 32, qlinear.ACT8 + 8),
}


def isas():
    return qlinear.EXT.supported_isas()


def reference_activations(x: torch.Tensor, groups: int, group: int = 32):
    """x [M, K] -> int8 codes [M, group * groups], d_x, s_x [M, groups], the codes' sums [M, groups] int32:
    round(x * fl(127 / amax)) to nearest even, d_x = amax / 127, s_x = d_x * sum(codes), all in float32
    (tensor / tensor divisions: PyTorch turns a scalar numerator into reciprocal-times, which rounds
    differently)."""
    xg = F.pad(x.float(), (0, group * groups - x.shape[1])).view(x.shape[0], groups, group)
    amax = xg.abs().amax(-1)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(xg * inv[..., None])
    d = amax / torch.full_like(amax, 127.0)
    return q.to(torch.int8).view(x.shape[0], -1), d, d * q.sum(-1), q.sum(-1).to(torch.int32)


def weights(fmt: str, n: int, k: int, seed: int = 0):
    """A random weight [n, k] in format `fmt` -> (packed, codes [n, Kp] float64, d_w [G, n] float32, m_w [G, n]
    float32 or None)."""
    bits, group, _ = FORMATS[fmt]
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    kp = -(-k // group) * group
    if bits == 4:
        codes, scale_zero = quantize_int4(F.pad(w, (0, kp - k)), group)
        scale, low = qlinear.w4a8_scale_min(scale_zero)  # as the record stores them
        return qlinear.pack_w4a8(codes, scale_zero), codes.double(), scale.float(), low.float()
    codes, scale = quantize_int8(w)
    return qlinear.pack_w8a8(codes, scale), F.pad(codes, (0, kp - k)).double(), scale.expand(kp // 32, n), None


def reference(x, codes, d_w, m_w):
    """The terms each output element sums -> (their float64 sum [M, N], the bound above)."""
    groups = d_w.shape[0]
    group = codes.shape[1] // groups
    q, d, s, _ = reference_activations(x, groups, group)
    isum = torch.einsum("mgj,ngj->mng", q.double().view(len(x), groups, group), codes.view(len(codes), groups, group))
    terms = isum * (d_w.T[None] * d[:, None, :]).double()  # fl(d_w * d_x) as the kernel rounds it
    if m_w is not None:
        terms = terms + m_w.T[None].double() * s[:, None, :].double()
    bound = (
        groups
        * 2**-23
        * (
            isum.abs() * (d_w.T[None] * d[:, None, :]).double()
            + (0 if m_w is None else (m_w.T[None].double() * s[:, None, :].double()).abs())
        ).sum(-1)
    )
    return terms.sum(-1), bound


def run(x, packed, fmt, n, isa, monkeypatch):
    monkeypatch.setitem(qlinear.EXT.state, "caps", qlinear.EXT.path_caps(isa))
    return qlinear.dot_linear(x, packed, FORMATS[fmt][2], n)


@pytest.mark.parametrize("isa", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["w8a8", "w4a8_g128"])  # groups of 32 (w4a8's too), of 128
def test_activations_quantize_exactly_as_the_reference(isa, dtype, fmt, monkeypatch):
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    monkeypatch.setitem(qlinear.EXT.state, "caps", qlinear.EXT.path_caps(isa))
    _, group, kind = FORMATS[fmt]
    x = torch.randn(6, 7 * group - 21, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 6)[:, None]
    x[2, group + 1 : 2 * group + 1] = 0  # an all-zero group (the second, after the shift below): d_x = 0, codes 0
    x[3, 5] = 1e4  # one outlier: the rest of its group rounds to few levels
    x = x.to(dtype)
    got = qlinear.quantize_activations(x[:, 1:], 7, kind)  # strided, the last group partly padding
    want = reference_activations(x[:, 1:], 7, group)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got[0].abs().max() == 127 and (got[0][2, group : 2 * group] == 0).all()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("isa", ALL)
@pytest.mark.parametrize(
    "n,k", [(16, 32), (53, 96), (130, 50), (70, 300), (1, 7)]
)  # N, K off the 16/64 blocks and the groups (300: whole groups of 32 and 128, then a part)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(fmt, isa, n, k, dtype, monkeypatch):
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    packed, codes, d_w, m_w = weights(fmt, n, k)
    for m in (1, 2, 3, 5, 8, 13):  # passes of 4 rows and the rests
        x = torch.randn(m, k + 3, generator=torch.Generator().manual_seed(m))[:, 1 : k + 1].to(dtype)  # strided rows
        y = run(x, packed, fmt, n, isa, monkeypatch)
        assert y.shape == (m, n) and y.dtype == dtype
        ref, bound = reference(x, codes, d_w, m_w)
        if dtype == torch.bfloat16:
            bound = bound + 2**-8 * ref.abs()
        assert ((y.double() - ref).abs() <= bound).all(), (m, (y.double() - ref).abs().max().item())


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_isa_gives_the_same_bits(fmt, monkeypatch):
    packed, *_ = weights(fmt, 100, 288, seed=1)  # K 288: two groups of 128 and a part, nine of 32
    # 16 rows and up: w4a8's AMX tiles on amx (83: six row tiles, the last of three rows); 100 outputs:
    # w4a8_g128's pairs of blocks, the last pair partly padding
    x = torch.randn(83, 288, generator=torch.Generator().manual_seed(2))
    outs = {
        isa: torch.cat(
            [run(x[:m], packed, fmt, 100, isa, monkeypatch) for m in (1, 2, 3, 9, 16, 41, 64, 65)]
            + [run(x, packed, fmt, 100, isa, monkeypatch)]
        )
        for isa in isas()
    }
    for isa, out in outs.items():
        assert torch.equal(out, outs["scalar"]), isa


def test_each_isa_runs_its_dot_path(monkeypatch):
    """A path that needs avx512_vnni: vpdpbusd; else one that needs avx2: AVX2's maddubs; scalar: scalar."""
    for isa in isas():
        needs = qlinear.EXT.path_caps(isa).names
        monkeypatch.setitem(qlinear.EXT.state, "caps", qlinear.EXT.path_caps(isa))
        want = "avx512_vnni" if "avx512_vnni" in needs else "avx2" if "avx2" in needs else "scalar"
        assert qlinear.dot_path() == want, isa
    assert "avx512_vnni" not in qlinear.EXT.supported_isas() or qlinear.EXT.path_caps("avx512_vnni").names == {
        "avx2",
        "avx512",
        "avx512_vnni",
    }


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_extreme_codes_are_exact_on_every_isa(fmt, monkeypatch):
    """The largest products (codes 15 or +-127 times activations +-127, so every code at the top of its
    range) and the smallest (0, -127): no int16 or int32 step saturates, and every ISA gives the
    reference's integer sums: with d_w = 1, m_w = 0 and x = +-127 (codes x, d_x = 1) the outputs are
    the sums over K, exact in float32 (integers below 2^24)."""
    n, k = 64, 256
    bits, group, _ = FORMATS[fmt]
    gen = torch.Generator().manual_seed(7)
    x = torch.where(torch.rand(21, k, generator=gen) < 0.5, -127.0, 127.0)  # 21 rows: AMX's tiles too
    x[1] = 127.0  # all codes 127: the largest positive sums
    x[2] = -127.0  # all -127
    hi = torch.randint(0, 2, (n, k), generator=gen)
    if bits == 4:
        codes = hi * 15  # 0 or 15 per weight
        codes[:8] = 15
        ones = torch.stack((torch.ones(k // group, n), torch.full((k // group, n), 8.0)), -1)  # scale 1, min 0
        packed, w = qlinear.pack_w4a8(codes, ones), codes
    else:
        codes = (hi * 254 - 127).to(torch.int8)  # -127 or 127
        codes[:8], codes[8:16] = 127, -127
        packed, w = qlinear.pack_w8a8(codes, torch.ones(n)), codes
    want = x.double() @ w.double().T
    for isa in isas():
        y = run(x, packed, fmt, n, isa, monkeypatch)
        assert torch.equal(y.double(), want), (isa, (y.double() - want).abs().max().item())


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("isa", ["scalar", "best"])
def test_rows_do_not_depend_on_the_batch_or_threads(fmt, isa, monkeypatch):
    """A row alone and in batches of 7, 64 and 300 rows, on 1 or 2 threads: identical bits."""
    isa = isas()[-1] if isa == "best" else isa
    packed, *_ = weights(fmt, 150, 96, seed=3)
    x = torch.randn(300, 96, generator=torch.Generator().manual_seed(4))
    with torch_threads(1):
        full = run(x, packed, fmt, 150, isa, monkeypatch)
    with torch_threads(2):
        assert torch.equal(run(x, packed, fmt, 150, isa, monkeypatch), full)
        for m in (1, 7, 64, 300):
            assert torch.equal(run(x[300 - m :], packed, fmt, 150, isa, monkeypatch), full[300 - m :]), m
            for row in (0, m // 2, m - 1):
                i = 300 - m + row
                assert torch.equal(run(x[i : i + 1], packed, fmt, 150, isa, monkeypatch), full[i : i + 1]), (m, row)


def int4_at_128(linear: nn.Linear) -> nn.Linear:
    """linear with its weight as W4A8G128Linear stores it (int4 on groups of 128, float16 scale and min)."""
    w = linear.weight.detach().float()
    codes, scale_zero = quantize_int4(F.pad(w, (0, -w.shape[1] % qlinear.G128)), qlinear.G128)
    scale, low = (t.float() for t in qlinear.w4a8_scale_min(scale_zero))
    ref = nn.Linear(w.shape[1], w.shape[0])
    ref.weight.data = dequantize_int4(codes, torch.stack((scale, low + 8 * scale), -1), qlinear.G128)[:, : w.shape[1]]
    ref.bias.data = linear.bias.detach().float()
    return ref


@pytest.mark.parametrize("cls", [W4A8Linear, W4A8G128Linear, W8A8Linear])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_linears_are_their_weights_up_to_the_activation_rounding(cls, dtype):
    """K = 50 and N = 53 with a bias, [B, T, K] input: the same weights as Int4Linear / Int8Linear (w4a8_g128:
    int4 on groups of 128), so the outputs differ only by the int8 rounding of the activations (< 2% of the
    output's norm)."""
    torch.manual_seed(0)
    linear = nn.Linear(50, 53, bias=True).to(dtype)
    x = torch.randn(2, 3, 50).to(dtype)
    y = cls.from_linear(linear)(x)
    if cls is W4A8G128Linear:
        ref = int4_at_128(linear)(x.float())
    else:
        ref = (Int4Linear if cls is W4A8Linear else Int8Linear).from_linear(linear)(x)
    assert y.shape == (2, 3, 53) and y.dtype == dtype
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 0.02


@torch.no_grad()
def test_without_the_extension_w4a8_runs_int4_with_one_warning(monkeypatch):
    monkeypatch.setitem(qlinear.EXT.state, "module", None)
    monkeypatch.setitem(qlinear.EXT.state, "reason", "test")
    with pytest.warns(RuntimeWarning, match="w4a8 needs the native linears .*using int4") as caught:
        route = decide_route(quantization="w4a8")
    assert len(caught) == 1 and route.weights == "int4" and not route.qlinear
    assert route.linear_class("o_proj", 64) is Int4Linear and route.absorbed_dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("isa", ALL)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_activation_reaches_its_row_and_only_it(fmt, isa, bad, monkeypatch):
    """As in a float linear, a NaN or Inf input makes its row's outputs non-finite (so the engine's
    NaN check fails that request), wherever it sits in the group; the other rows keep their bits."""
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    packed, *_ = weights(fmt, 40, 200, seed=5)
    x = torch.randn(6, 200, generator=torch.Generator().manual_seed(6))
    clean = run(x, packed, fmt, 40, isa, monkeypatch)
    for col in (0, 7, 8, 31, 64, 127, 130):  # lanes of the first vector, ends of groups of 32 and 128, the next
        bad_x = x.clone()
        bad_x[2, col] = bad
        y = run(bad_x, packed, fmt, 40, isa, monkeypatch)
        assert not torch.isfinite(y[2]).any(), col
        assert torch.equal(torch.cat((y[:2], y[3:])), torch.cat((clean[:2], clean[3:]))), col
