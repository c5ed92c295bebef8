"""The q4_0 cache format (latentkv/cache/q4.py): llama.cpp's q4_0 blocks, and the fixed turn of the
rope key."""

import pytest
import torch

from latentkv.attention.paged import gather, write
from latentkv.cache import q4
from latentkv.cache.latent_cache import LatentCache
from latentkv.facts import Q4_GROUP


@pytest.mark.parametrize("n", [1, 7, 32, 33, 96, 168, 192, 240])
def test_a_row_round_trips_within_an_eighth_of_its_groups_largest_value(n):
    """d = m / -8 (m the group's largest magnitude, sign kept; float16): m itself is code 0, exact up
    to d's float16 rounding; every other value rounds to the nearest of 16 levels, or clamps at 7d
    (values of the other sign up to |m|): error <= |d| = max|x| / 8 (plus d's rounding)."""
    x = torch.randn(9, n, generator=torch.Generator().manual_seed(n)) * torch.logspace(-3, 2, 9)[:, None]
    codes, scales = q4.quantize(x)
    assert codes.dtype == torch.uint8 and codes.shape == (9, q4.packed_bytes(n)) == (9, -(-n // 2))
    assert scales.dtype == torch.float16 and scales.shape == (9, q4.groups(n))
    back = q4.dequantize(codes, scales, n, torch.float32)
    for g0 in range(0, n, Q4_GROUP):
        xs, ys = x[:, g0 : g0 + Q4_GROUP], back[:, g0 : g0 + Q4_GROUP]
        bound = xs.abs().amax(-1, keepdim=True) / 8 * (1 + 2**-10)
        assert ((xs - ys).abs() <= bound).all()
        top = xs.abs().argmax(-1, keepdim=True)
        assert torch.allclose(ys.gather(-1, top), xs.gather(-1, top), rtol=2**-10)  # the largest is kept
    assert torch.equal(q4.unpack(codes, n), q4.unpack(q4.pack(q4.unpack(codes, n)), n))


def test_zero_rows_and_empty_widths():
    codes, scales = q4.quantize(torch.zeros(2, 40))
    assert torch.equal(q4.dequantize(codes, scales, 40, torch.float32), torch.zeros(2, 40))
    codes, scales = q4.quantize(torch.zeros(2, 0))
    assert codes.shape == (2, 0) and scales.shape == (2, 0)
    assert q4.turn(torch.ones(3, 0)).shape == (3, 0)


@pytest.mark.parametrize("n", [2, 6, 32, 96, 160, 192])
def test_the_turn_is_orthogonal_and_its_rows_do_not_depend_on_the_batch(n):
    x = torch.randn(50, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64).float()
    turned = q4.turn(x)
    assert torch.allclose(turned.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    assert torch.allclose(q4.turn_back(turned), x, atol=1e-5)
    y = torch.randn(50, n, generator=torch.Generator().manual_seed(2))
    assert torch.allclose((q4.turn(x) * q4.turn(y)).sum(-1), (x * y).sum(-1), atol=1e-4)  # scores unchanged
    assert all(torch.equal(q4.turn(x[i : i + 1])[0], turned[i]) for i in (0, 17, 49))  # bit-identical alone


def test_the_turn_spreads_a_pair_over_every_value():
    """What it is for: a key whose size sits in one RoPE pair comes out with no value far above the
    row's RMS, so 16 levels per 32 values keep it."""
    x = torch.zeros(1, 192)
    x[0, 5], x[0, 101] = 3.0, -2.0
    turned = q4.turn(x)
    assert turned.abs().max() < 4 * turned.pow(2).mean().sqrt()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cache_writes_q4_0_blocks_and_reads_the_rope_key_turned_back(dtype):
    gen = torch.Generator().manual_seed(3)
    cache = LatentCache(num_blocks=3, block_size=4, kv_rank=40, rope_dim=24, dtype=dtype, cache_dtype="q4_0")
    assert cache.q4 and cache.quantized and cache.scale.dtype == torch.float16
    assert cache.nbytes() == 3 * 4 * (20 + 12 + 2 * (2 + 1))
    c, k_r = torch.randn(6, 40, generator=gen), torch.randn(6, 24, generator=gen)
    slots = torch.tensor([8, 9, 10, 11, 0, 1])
    write(cache, c.to(dtype), k_r.to(dtype), slots)
    rows = gather(cache, torch.tensor([[2, 0]]))[0, [0, 1, 2, 3, 4, 5]]
    assert rows.dtype == dtype
    # the latent within an eighth of its group's largest value; the rope key the same in the turned basis
    for got, want in ((rows[:, :40].float(), c), (q4.turn(rows[:, 40:].float()), q4.turn(k_r))):
        bound = want.abs().amax(-1, keepdim=True) / 8 + 0.02 * want.abs().amax(-1, keepdim=True)
        assert ((got - want).abs() <= bound).all()


def test_only_per_token_scaled_latents_have_a_code_maximum():
    assert LatentCache(1, 16, 64, 32, cache_dtype="int8").qmax == 127.0
    for fmt in ("q4_0", "auto"):  # q4_0 scales each 32 values; a misuse fails loudly instead of passing 0
        with pytest.raises(ValueError, match="no per-token code maximum"):
            LatentCache(1, 16, 64, 32, cache_dtype=fmt).qmax
