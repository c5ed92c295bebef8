"""The fused decode-step ops (model/fused.py, csrc/decode_ops.cpp) against their PyTorch reference.

Tolerances: float32 1e-5 relative to the output's scale (float32 accumulation in another order);
bfloat16: the outputs are rounded once where the reference rounds between ops, so within 2 bf16
ulps (2^-7 relative). Quantized cache writes must store the same codes as the reference writer
(up to a code of 1 where c / scale lands on a rounding tie)."""

import pytest
import torch
import torch.nn.functional as F

from latentkv.attention.paged import write
from latentkv.cache.latent_cache import LatentCache
from latentkv.model import fused
from latentkv.model.route import decide_route
from latentkv.rope import apply_rope, cos_sin, default_inv_freq

pytestmark = pytest.mark.skipif(not fused.available(), reason=f"fused ops not built: {fused.EXT.unavailable_reason()}")

TOL = {torch.float32: 1e-5, torch.bfloat16: 2**-7}
DTYPES = [torch.float32, torch.bfloat16]


def close(out, ref, dtype):
    if ref.numel() == 0:
        assert out.shape == ref.shape
        return
    scale = ref.float().abs().max().clamp_min(1e-6)
    assert (out.float() - ref.float()).abs().max() / scale <= TOL[dtype]


def reference(fn, *args):
    """Run a fused.* op on its PyTorch path (as a route without the fused ops runs it)."""
    return fn(*args, kernel=False)


def isas():
    return fused.EXT.supported_isas()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "amx_bf16"])
@pytest.mark.parametrize(
    "n,heads,k,c,extra",
    [(1, 9, 64, 256, 64), (7, 3, 40, 33, 0), (70, 2, 16, 130, 8), (70, 4, 100, 48, 3), (37, 9, 240, 64, 0)],
)  # amx: K % 32 tails, 16-row tiles
@torch.no_grad()
def test_head_matmul(dtype, isa, n, heads, k, c, extra, monkeypatch):
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    monkeypatch.setitem(fused.EXT.state, "caps", fused.EXT.path_caps(isa))
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(n, heads, k + extra + 5, generator=gen).to(dtype)  # strided views, as project() gives
    x, e = q[..., :k], (q[..., k : k + extra] if extra else None)
    w = torch.randn(heads, k, c, generator=gen).to(dtype)
    out = fused.head_matmul(x, w, 0.3, e, kernel=True)
    exact = torch.bmm(x.transpose(0, 1).double(), w.double()).transpose(0, 1)
    if extra:
        exact = torch.cat((exact, e.double()), dim=-1)
    close(out, exact * 0.3, dtype)
    close(reference(fused.head_matmul, x, w, 0.3, e), exact * 0.3, dtype)
    packed = fused.head_pack(w)  # the AMX layout where that path applies (bf16, C % 16 == 0, K >= 32), else empty
    assert (packed.numel() > 0) == (isa == "amx_bf16" and dtype == torch.bfloat16 and c % 16 == 0 and k >= 32)
    assert torch.equal(fused.head_matmul(x, w, 0.3, e, kernel=True, packed=packed), out)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@torch.no_grad()
def test_head_matmul_takes_bf16_weights_under_float32_rows(isa, monkeypatch):
    """The quantized modes store W_UK / W_UV in bf16 (Route.absorbed_dtype): widened in the
    kernel, exactly the float32 product with the same values."""
    if isa not in isas():
        pytest.skip(f"this CPU does not run {isa}")
    monkeypatch.setitem(fused.EXT.state, "caps", fused.EXT.path_caps(isa))
    gen = torch.Generator().manual_seed(2)
    x, e = torch.randn(5, 9, 50, generator=gen), torch.randn(5, 9, 96, generator=gen)
    w = torch.randn(9, 50, 248, generator=gen).to(torch.bfloat16)
    out = fused.head_matmul(x, w, 0.3, e, kernel=True)
    assert out.dtype == torch.float32 and torch.equal(out, fused.head_matmul(x, w.float(), 0.3, e, kernel=True))
    close(reference(fused.head_matmul, x, w, 0.3, e), out.double(), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [256, 248, 37])
@torch.no_grad()
def test_head_matmul_rows_do_not_depend_on_the_batch(dtype, c):
    """Batch invariance: a row's bits are the same alone and among 37 others (38 rows: 4-row
    tiles and single rows, or 16-row AMX tiles with a tail; widths with a column tail on every
    vector width)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(38, 9, 64, generator=gen).to(dtype)
    w = torch.randn(9, 64, c, generator=gen).to(dtype)
    batched = fused.head_matmul(x, w, 0.125, kernel=True)
    packed = fused.head_pack(w)  # AMX CPUs, bf16, c = 256: the tile path
    for i in (0, 5, 36, 37):
        assert torch.equal(fused.head_matmul(x[i : i + 1], w, 0.125, kernel=True)[0], batched[i])
        assert torch.equal(fused.head_matmul(x[i : i + 1], w, 0.125, kernel=True, packed=packed)[0], batched[i])
    assert torch.equal(fused.head_matmul(x[35:37], w, 0.125, kernel=True), batched[35:37])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
@torch.no_grad()
def test_rope(dtype, interleaved):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, 40, generator=gen).to(dtype)[..., 8:]  # [5, 4, 32], strided
    cos, sin = cos_sin(torch.tensor([0, 3, 17, 100, 4000]), default_inv_freq(32, 10000.0))
    out = fused.rope(x, cos, sin, interleaved, kernel=True)
    close(out, apply_rope(x.float(), cos, sin, interleaved), dtype)
    slots = torch.tensor([3, 3, 0, 15, 7, 1, 2, 9, 4, 4, 5, 6, 8, 10, 11, 12])  # columns of the tables, repeats allowed
    close(
        fused.rope(x, cos, sin, interleaved, kernel=True, slots=slots),
        apply_rope(x.float(), cos[:, slots], sin[:, slots], interleaved),
        dtype,
    )
    assert torch.equal(
        fused.rope(x, cos, sin, interleaved, slots=slots), apply_rope(x, cos[:, slots], sin[:, slots], interleaved)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", ["auto", "int8", "fp8_e4m3", "int8_rope8", "fp8_e4m3_rope8"])
@pytest.mark.parametrize("rank,rope", [(256, 64), (32, 0), (48, 16)])
@torch.no_grad()
def test_write_latent_matches_the_reference_writer(dtype, cache_dtype, rank, rope):
    """Fused rope + quantization + write stores what rope, then attention.paged.write, stores."""
    gen = torch.Generator().manual_seed(rank)
    t, interleaved = 11, rank % 64 == 0
    kv = torch.randn(t, rank + rope + 3, generator=gen).to(dtype) * 3  # c and k_r: strided views
    c, k_r = kv[:, :rank], kv[:, rank : rank + rope]
    cos, sin = cos_sin(torch.arange(t) * 7, default_inv_freq(rope, 10000.0)) if rope else (torch.zeros(t, 0),) * 2
    slots = torch.randperm(4 * 16, generator=gen)[:t]
    ours, ref = (LatentCache(4, 16, rank, rope, dtype, cache_dtype) for _ in range(2))
    fused.write_latent(ours, c, k_r, slots, (cos, sin, interleaved), kernel=True)
    write(ref, c, apply_rope(k_r[:, None], cos, sin, interleaved)[:, 0] if rope else k_r, slots)
    if cache_dtype == "auto":
        close(ours.kv, ref.kv, dtype)
        return
    if ours.rope8:  # codes of the rotated key: the native rotation may round one code the other way
        assert torch.equal(ours.scale[..., 0], ref.scale[..., 0])
        torch.testing.assert_close(
            ours.scale[..., 1], ref.scale[..., 1], rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=0
        )
        assert (ours.rope.int() - ref.rope.int()).abs().le(1).all()
    else:
        assert torch.equal(ours.scale, ref.scale)
        close(ours.rope, ref.rope, dtype)
    if ours.latent_dtype == "int8":
        assert (ours.latent.int() - ref.latent.int()).abs().max() <= 1
    else:
        values = [cache.latent.view(torch.float8_e4m3fn).float() for cache in (ours, ref)]
        assert torch.equal(values[0], values[1])


@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_rms_norm_and_silu_mul(dtype):
    gen = torch.Generator().manual_seed(3)
    x, h = (torch.randn(6, 96, generator=gen).to(dtype) * 4 for _ in range(2))
    w = torch.randn(96, generator=gen).to(dtype)
    total, normed = fused.rms_norm(x, w, 1e-5, h, kernel=True)
    assert torch.equal(total, x + h)
    close(normed, F.rms_norm((x + h).float(), (96,), w.float(), 1e-5), dtype)
    close(fused.rms_norm(x, w, 1e-5, kernel=True), F.rms_norm(x.float(), (96,), w.float(), 1e-5), dtype)
    gate_up = torch.randn(6, 2 * 48, generator=gen).to(dtype)
    gate, up = gate_up.float().chunk(2, dim=-1)
    close(fused.silu_mul(gate_up, kernel=True), F.silu(gate) * up, dtype)


def test_the_switch_turns_the_native_ops_off(monkeypatch):
    """LATENTKV_FUSED=0: no extension, and the route runs every op's reference."""
    monkeypatch.setattr(fused.EXT, "state", {})
    monkeypatch.setenv("LATENTKV_FUSED", "0")
    assert not fused.available() and "LATENTKV_FUSED=0" in fused.EXT.unavailable_reason()
    assert not decide_route().fused


def test_autograd_takes_the_reference():
    """Healing trains through the model: with gradients on, the ops are the differentiable reference."""
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(3, 8, 5)
    fused.head_matmul(x, w, 0.5, kernel=True).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_silu_mul_every_isa_any_width_and_rows_alone(monkeypatch, dtype):
    """The vectorized silu (a polynomial exp) on every instruction set this CPU runs, widths that
    are not a multiple of the vector, large and tiny gates; a row alone gives the same bits."""
    if not fused.available():
        pytest.skip(f"fused ops not built: {fused.EXT.unavailable_reason()}")
    gen = torch.Generator().manual_seed(5)
    gate_up = torch.randn(300, 2 * 37, generator=gen) * 6
    gate_up[0, :8] = torch.tensor([-200.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 90.0])
    gate_up = gate_up.to(dtype)
    gate, up = gate_up.float().chunk(2, dim=-1)
    for isa in fused.EXT.supported_isas():
        monkeypatch.setitem(fused.EXT.state, "caps", fused.EXT.path_caps(isa))
        out = fused.silu_mul(gate_up, kernel=True)
        close(out, F.silu(gate) * up, dtype)
        assert all(
            torch.equal(fused.silu_mul(gate_up[t : t + 1], kernel=True), out[t : t + 1]) for t in (0, 1, 150, 299)
        ), isa


@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_rms_norm_every_isa_with_and_without_residual_rows_alone(monkeypatch, dtype):
    """The vectorized RMSNorm on every instruction set this CPU runs, a width that is not a
    multiple of the vector; a row alone gives the same bits as in a batch."""
    if not fused.available():
        pytest.skip(f"fused ops not built: {fused.EXT.unavailable_reason()}")
    gen = torch.Generator().manual_seed(6)
    x, h = (torch.randn(70, 93, generator=gen).to(dtype) * 3 for _ in range(2))
    w = torch.randn(93, generator=gen).to(dtype)
    for isa in fused.EXT.supported_isas():
        monkeypatch.setitem(fused.EXT.state, "caps", fused.EXT.path_caps(isa))
        total, normed = fused.rms_norm(x, w, 1e-5, h, kernel=True)
        assert torch.equal(total, x + h)
        close(normed, F.rms_norm((x + h).float(), (93,), w.float(), 1e-5), dtype)
        plain = fused.rms_norm(x, w, 1e-5, kernel=True)
        close(plain, F.rms_norm(x.float(), (93,), w.float(), 1e-5), dtype)
        for t in (0, 33, 69):
            assert torch.equal(
                fused.rms_norm(x[t : t + 1], w, 1e-5, h[t : t + 1], kernel=True)[1], normed[t : t + 1]
            ), isa
            assert torch.equal(fused.rms_norm(x[t : t + 1], w, 1e-5, kernel=True), plain[t : t + 1]), isa
