"""The native int4 / int8 linear (kernels/qlinear.py, kernels/csrc/qlinear/qlinear.cpp) against the float64 product of
the dequantized weights, on every instruction set this CPU runs.

Tolerance: float32 accumulation in another order than float64, so |error| <= 1e-5 times the sum of
|x| * (|w| + the row's largest |w|) over K (int4 sums q * scale and min * sum(x) apart, each term
bounded by that); bf16 outputs are rounded once more (2^-8 relative)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentkv.kernels import build, qlinear
from latentkv.model import fused
from latentkv.model.deepseek import MLP
from latentkv.model.quant import FixedOrderLinear, Int4Linear, Int8Linear, dequantize_int4, quantize_int4, quantize_int8
from latentkv.model.route import decide_route
from threads import torch_threads

pytestmark = pytest.mark.skipif(not qlinear.available(), reason=f"qlinear not built: {qlinear.unavailable_reason()}")

KINDS = (4, 8, 16, 32)  # int4, int8, bf16 and float32 weights (the batch-invariant linears)


def isas():
    return qlinear.EXT.supported_isas()


def quantized(bits: int, n: int, k: int, seed: int = 0):
    """A random weight [n, k] -> (packed, its dequantized float64 [n, k])."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    if bits == 4:
        codes, scale_zero = quantize_int4(F.pad(w, (0, -k % 32)))  # K padded to whole groups, as Int4Linear does
        return qlinear.pack_int4(codes, scale_zero), dequantize_int4(codes, scale_zero)[:, :k].double()
    if bits == 32:
        return qlinear.pack_f32(w), w.double()
    if bits == 16:
        return qlinear.pack_bf16(w), w.bfloat16().double()
    codes, scale = quantize_int8(w)
    return qlinear.pack_int8(codes, scale), codes.double() * scale.double()[:, None]


def run(x, packed, bits, n, isa, monkeypatch):
    monkeypatch.setitem(qlinear.EXT.state, "caps", qlinear.EXT.path_caps(isa))
    return qlinear.linear(x, packed, bits, n)


@pytest.mark.parametrize("bits", KINDS)
@pytest.mark.parametrize("isa", ["scalar", *build.CAPS])
@pytest.mark.parametrize("n,k", [(16, 32), (53, 96), (130, 50), (70, 200)])  # N, K off the 16/64 blocks and 32 groups
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_dequantized_weights(bits, isa, n, k, dtype, monkeypatch):
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    packed, w = quantized(bits, n, k)
    for m in (1, 2, 3, 5, 8, 13):  # the direct (M < 4; AVX-512: M < 12) and the tile passes
        x = torch.randn(m, k + 3, generator=torch.Generator().manual_seed(m))[:, 1 : k + 1].to(dtype)  # strided rows
        y = run(x, packed, bits, n, isa, monkeypatch)
        assert y.shape == (m, n) and y.dtype == dtype
        assert_near(y, x, w, m)


def assert_near(y, x, w, what):
    """y = x · wᵀ within the module docstring's bound (w: the dequantized float64 weight)."""
    xd = x.double()
    ref = xd @ w.T
    bound = 1e-5 * (xd.abs() @ (w.abs() + w.abs().amax(1, keepdim=True)).T)
    if x.dtype == torch.bfloat16:
        bound = bound + 2**-8 * ref.abs()
    assert ((y.double() - ref).abs() <= bound).all(), (what, (y.double() - ref).abs().max().item())


@pytest.mark.parametrize("bits", KINDS)
def test_every_isa_gives_the_same_bits(bits, monkeypatch):
    """Rows sit in the lanes and every lane runs the scalar loop's operations (fma included)."""
    packed, _ = quantized(bits, 100, 160, seed=1)
    x = torch.randn(9, 160, generator=torch.Generator().manual_seed(2))
    outs = {
        isa: torch.cat(
            [run(x[:m], packed, bits, 100, isa, monkeypatch) for m in (1, 2, 3)]
            + [run(x, packed, bits, 100, isa, monkeypatch)]
        )
        for isa in isas()
    }
    for isa, out in outs.items():
        assert torch.equal(out, outs["scalar"]), isa


@pytest.mark.parametrize("bits", KINDS)
@pytest.mark.parametrize("isa", ["scalar", "best"])
def test_rows_do_not_depend_on_the_batch_or_threads(bits, isa, monkeypatch):
    """A row alone, in a batch of 1..33 rows (both kernels: direct below 4 rows, 12 on AVX-512, tile
    above) and on 1 or 2 threads gives identical bits: no padding needed in invariant.py."""
    isa = isas()[-1] if isa == "best" else isa
    packed, _ = quantized(bits, 200, 96, seed=3)
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(4))
    with torch_threads(1):
        full = run(x[3:36], packed, bits, 200, isa, monkeypatch)
    with torch_threads(2):
        assert torch.equal(run(x[3:36], packed, bits, 200, isa, monkeypatch), full)
        for m in range(1, 34):
            assert torch.equal(run(x[3 : 3 + m], packed, bits, 200, isa, monkeypatch), full[:m]), m
            assert torch.equal(run(x[3 + m - 1 : 3 + m], packed, bits, 200, isa, monkeypatch), full[m - 1 : m]), m


@pytest.mark.parametrize("bits", KINDS)
def test_rows_keep_their_bits_in_prefill_sized_batches(bits, monkeypatch):
    """The blocked many-row path (M blocks, k blocks, column chunks, a short last unit: N = 200 is
    13 blocks, K = 600 is 19 groups in uneven k blocks) at prefill sizes: a row alone, or inside
    batches of 5, 300 and 2100 rows (several M blocks), on 1 or 2 threads, has the same bits; the
    scalar path (no blocking) agrees with the best ISA; all near the float64 product."""
    isa = isas()[-1]
    packed, w = quantized(bits, 200, 600, seed=5)
    x = torch.randn(2100, 600, generator=torch.Generator().manual_seed(6))
    with torch_threads(1):
        full = run(x, packed, bits, 200, isa, monkeypatch)
    with torch_threads(2):
        assert torch.equal(run(x, packed, bits, 200, isa, monkeypatch), full)
    assert_near(full, x, w, "2100 rows")
    for start, m in ((0, 5), (0, 300), (7, 300), (1500, 600)):
        assert torch.equal(run(x[start : start + m], packed, bits, 200, isa, monkeypatch), full[start : start + m]), (
            start,
            m,
        )
    for r in (0, 4, 299, 1000, 2099):
        assert torch.equal(run(x[r : r + 1], packed, bits, 200, isa, monkeypatch), full[r : r + 1]), r
    assert torch.equal(run(x[:300], packed, bits, 200, "scalar", monkeypatch), full[:300])


@pytest.mark.parametrize("cls", [Int4Linear, Int8Linear])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_linears_run_the_kernel_for_any_shape(cls, dtype):
    """K = 50 (not whole groups: ATen's int4 kernel refused it) and N = 53, with a bias, [B, T, K]
    input; against the dequantized weights (scales stored in the model dtype), then + bias."""
    torch.manual_seed(0)
    linear = nn.Linear(50, 53, bias=True).to(dtype)
    q = cls.from_linear(linear)
    assert q.uses_qlinear and not hasattr(q, "weight_int4") and not hasattr(q, "weight_int8")
    if cls is Int4Linear:
        codes, scale_zero = quantize_int4(F.pad(linear.weight, (0, 14)))
        w = dequantize_int4(codes, scale_zero.to(dtype))[:, :50]
    else:
        codes, scale = quantize_int8(linear.weight)
        w = codes.float() * scale.to(dtype).float()[:, None]
    x = torch.randn(2, 3, 50).to(dtype)
    ref = x.float() @ w.T + linear.bias.float()
    y = q(x)
    assert y.shape == (2, 3, 53) and y.dtype == dtype
    assert (y.float() - ref).abs().max() <= (1e-5 if dtype == torch.float32 else 2**-7) * ref.abs().max()


@torch.no_grad()
def test_without_the_extension_the_aten_kernels_run(monkeypatch):
    """The route says ATen's kernels where latentkv's is not built; they never touch the extension."""
    monkeypatch.setitem(qlinear.EXT.state, "module", None)
    monkeypatch.setitem(qlinear.EXT.state, "reason", "test")
    assert not decide_route(quantization="int4").qlinear
    linear = nn.Linear(64, 48)
    q4, q8 = Int4Linear.from_linear(linear, uses_qlinear=False), Int8Linear.from_linear(linear, uses_qlinear=False)
    assert hasattr(q4, "weight_int4") and hasattr(q8, "weight_int8") and q4.record is None and q8.record is None
    x = torch.randn(3, 64)
    ref = linear(x)
    for q in (q4, q8):
        assert (q(x) - ref).abs().max() <= 0.1 * ref.abs().max()


@pytest.mark.parametrize("isa", ["scalar", *build.CAPS])
def test_bf16_weights_times_bf16_rows_on_every_path(isa, monkeypatch):
    """The bf16 record with bf16 activations, as a bf16 model's FixedOrderLinear runs it: avx512_bf16
    takes vdpbf16ps (pairs of inputs, its own fixed order), amx the tile unit (one TDPBF16PS per
    group, rows padded to 16-row tiles), the others the FMA chain. On each path:
    near the float64 product, and a row's bits the same alone, in 1..33 rows (direct and tile
    passes), in 300 or 2100 rows (M blocks) and on 1 or 2 threads."""
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    packed, w = quantized(16, 200, 600, seed=7)
    x = torch.randn(2100, 600, generator=torch.Generator().manual_seed(8)).bfloat16()
    with torch_threads(1):
        full = run(x, packed, 16, 200, isa, monkeypatch)
    assert_near(full, x, w, isa)
    with torch_threads(2):
        assert torch.equal(run(x, packed, 16, 200, isa, monkeypatch), full)
        for m in list(range(1, 34)) + [300]:
            assert torch.equal(run(x[:m], packed, 16, 200, isa, monkeypatch), full[:m]), m
        for r in (0, 5, 299, 2099):
            assert torch.equal(run(x[r : r + 1], packed, 16, 200, isa, monkeypatch), full[r : r + 1]), r


def test_fused_swiglu_has_the_bits_of_the_product_then_silu_mul():
    """On AMX, swiglu_linear (SwiGLU in the product's last step, units of a gate block and its up
    block) gives exactly linear's bf16 output through decode_ops' silu_mul: alone, in 1..33 rows,
    in 300 and 2,100 rows (M blocks), with a K that is not whole groups, on 1 and 2 threads."""
    if "amx_bf16" not in isas():
        pytest.skip("this CPU has no AMX: the fused SwiGLU does not run")
    for k, inter in ((600, 96), (50, 16)):
        packed, _ = quantized(16, 2 * inter, k, seed=3)
        x = (torch.randn(2100, k, generator=torch.Generator().manual_seed(4)) * 4).bfloat16()
        want = fused.silu_mul(qlinear.linear(x, packed, 16, 2 * inter), kernel=True)
        for threads in (1, 2):
            with torch_threads(threads):
                assert torch.equal(qlinear.swiglu_linear(x, packed, inter), want)
                for m in list(range(1, 34)) + [300]:
                    assert torch.equal(qlinear.swiglu_linear(x[:m], packed, inter), want[:m]), m
    with pytest.raises(RuntimeError, match="multiple of 16"):
        qlinear.swiglu_linear(x[:4], qlinear.pack_bf16(torch.randn(40, 50)), 20)


def test_the_mlp_takes_the_fused_swiglu_where_it_runs_and_answers_the_same(monkeypatch):
    """A bf16 fixed-order MLP: its output is the same bits with the fused SwiGLU (AMX) and without
    it (the product, then silu_mul), and FixedOrderLinear.swiglu says None where it does not run."""
    torch.manual_seed(5)
    route = decide_route("cpu", torch.bfloat16, batch_invariant=True)
    mlp = MLP(64, 96, route).bfloat16()
    for module in (mlp.gate_up_proj, mlp.down_proj):
        module.weight.data.normal_(0, 0.1)
        module.pack_weights()
    x = torch.randn(37, 64).bfloat16()
    assert (mlp.gate_up_proj.swiglu(x) is not None) == ("amx_bf16" in isas())
    fused_out = mlp(x)
    monkeypatch.setattr(qlinear, "fused_swiglu", lambda bits, inter: False)
    assert mlp.gate_up_proj.swiglu(x) is None
    assert torch.equal(mlp(x), fused_out)


@torch.no_grad()
def test_fixed_order_linear_is_the_float32_linear():
    """FixedOrderLinear (what batch-invariant mode puts in place of float32 nn.Linear): the same
    product as F.linear up to float32 rounding, bias and [B, T, K] input included."""
    torch.manual_seed(0)
    linear = nn.Linear(70, 53, bias=True)
    fixed = FixedOrderLinear.from_linear(linear)
    x = torch.randn(2, 3, 70)
    ref = x.double() @ linear.weight.double().T + linear.bias.double()
    y = fixed(x)
    assert y.shape == (2, 3, 53) and y.dtype == torch.float32
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_failed_build_warns_once_and_names_the_fallback(monkeypatch):
    """A machine where the kernel cannot be built (here: the compiler "fails") gets one warning
    saying ATen's kernels run instead; `available()` is False and the reason is kept."""

    def fail(*args, **kwargs):
        raise OSError("no compiler\ng++: not found")

    monkeypatch.setattr(qlinear.EXT, "state", {})
    monkeypatch.setattr(build, "compile_extension", fail)
    with pytest.warns(
        RuntimeWarning, match="native int4/int8 linears are unavailable .*g\\+\\+: not found.*ATen's kernels"
    ):
        assert not qlinear.available()
    assert qlinear.unavailable_reason() == "OSError: g++: not found"
