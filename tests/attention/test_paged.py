import pytest
import torch

from latentkv.attention.metadata import block_runs
from latentkv.attention.paged import gather, pieces, read_positions, write
from latentkv.cache.latent_cache import LatentCache, dequantize_latent, quantize_latent


@pytest.mark.parametrize("cache_dtype", ["auto", "int8", "fp8_e4m3"])
def test_write_then_gather_through_block_table(cache_dtype):
    gen = torch.Generator().manual_seed(0)
    cache = LatentCache(
        num_blocks=6, block_size=4, kv_rank=16, rope_dim=8, dtype=torch.float32, cache_dtype=cache_dtype
    )
    c, k_r = torch.randn(7, 16, generator=gen), torch.randn(7, 8, generator=gen)
    table = [4, 1]  # tokens 0-3 in block 4, 4-6 in block 1
    slots = torch.tensor([4 * 4 + i for i in range(4)] + [1 * 4 + i for i in range(3)])
    write(cache, c, k_r, slots)
    kv = gather(cache, torch.tensor([table]))[0, :7]
    assert kv.shape == (7, 24)
    # the rope part is only rounded to its storage dtype (bf16 beside a quantized latent of a float32 model)
    rope_dtype = torch.float32 if cache_dtype == "auto" else torch.bfloat16
    assert cache.tensors()[-1].dtype == rope_dtype
    assert torch.equal(kv[:, 16:], k_r.to(rope_dtype).float())
    err = (kv[:, :16] - c).abs().max().item()
    bound = {"auto": 0.0, "int8": c.abs().max().item() / 127 / 2 + 1e-6, "fp8_e4m3": c.abs().max().item() / 16}[
        cache_dtype
    ]
    assert err <= bound


@pytest.mark.parametrize("cache_dtype", ["auto", "int8"])
def test_pieces_of_block_runs_equal_the_gather(cache_dtype):
    """A sequence on runs of consecutive blocks is read piece by piece: the same rows as a
    gather through its block table, and (unquantized) views of the cache, not copies."""
    gen = torch.Generator().manual_seed(1)
    cache = LatentCache(
        num_blocks=12, block_size=4, kv_rank=16, rope_dim=8, dtype=torch.float32, cache_dtype=cache_dtype
    )
    table = [2, 3, 4, 9, 10, 0]
    length = 4 * len(table) - 1
    slots = torch.tensor([table[i // 4] * 4 + i % 4 for i in range(length)])
    write(cache, torch.randn(length, 16, generator=gen), torch.randn(length, 8, generator=gen), slots)
    runs = block_runs(table)
    assert runs == [(2, 3), (9, 2), (0, 1)]
    parts = pieces(cache, runs, length)
    assert [p.shape[1] for p in parts] == [12, 8, 3]
    assert torch.equal(torch.cat(parts, 1), gather(cache, torch.tensor([table]))[:, :length])
    if cache_dtype == "auto":
        assert all(p.untyped_storage().data_ptr() == cache.kv.untyped_storage().data_ptr() for p in parts)
    assert block_runs(list(range(0, 40, 2))) is None  # too fragmented: gather instead


@pytest.mark.parametrize("cache_dtype", ["auto", "int8"])
@pytest.mark.parametrize("start,stop", [(0, 24), (5, 11), (8, 16), (13, 30)])
def test_read_positions_is_the_gather_with_rows_past_each_context_zero(cache_dtype, start, stop):
    """Two sequences of different lengths, a span that starts mid-block and one past both
    tables: the gathered rows, zero past each context (stale slots never leak), the cache
    untouched."""
    gen = torch.Generator().manual_seed(2)
    cache = LatentCache(
        num_blocks=12, block_size=4, kv_rank=16, rope_dim=8, dtype=torch.float32, cache_dtype=cache_dtype
    )
    slots = torch.arange(48)
    write(
        cache, torch.randn(48, 16, generator=gen), torch.randn(48, 8, generator=gen), slots
    )  # every slot stale-filled
    tables, lengths = torch.tensor([[3, 7, 1, 5, 0, 0], [2, 9, 11, 4, 8, 6]]), torch.tensor([10, 23])
    before = [t.clone() for t in cache.tensors()]
    rows = read_positions(cache, tables, lengths, start, stop)
    assert rows.shape == (2, stop - start, 24)
    full = gather(cache, tables)
    for i, length in enumerate(lengths.tolist()):
        for j, pos in enumerate(range(start, stop)):
            want = full[i, pos] if pos < length else torch.zeros(24)
            assert torch.equal(rows[i, j], want), (i, pos)
    assert all(torch.equal(a, b) for a, b in zip(before, cache.tensors()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_8_bit_rope_key_round_trips_within_half_a_step(dtype):
    """int8_rope8: the rope key as int8 codes with its own per-token scale (max|k_r| / 127), the
    latent's scale beside it in one [.., 2] tensor; read back within half a code step (plus the
    model dtype's rounding of code x scale)."""
    gen = torch.Generator().manual_seed(5)
    cache = LatentCache(num_blocks=3, block_size=4, kv_rank=16, rope_dim=8, dtype=dtype, cache_dtype="int8_rope8")
    c, k_r = torch.randn(6, 16, generator=gen), torch.randn(6, 8, generator=gen) * torch.logspace(-2, 1, 6)[:, None]
    slots = torch.tensor([8, 9, 10, 11, 0, 1])
    write(cache, c.to(dtype), k_r.to(dtype), slots)
    assert cache.rope.dtype == torch.int8 and cache.scale.shape == (3, 4, 2)
    kv = gather(cache, torch.tensor([[2, 0]]))[0, :6].float()
    step = k_r.to(dtype).float().abs().amax(-1, keepdim=True) / 127
    rounding = 2**-8 if dtype == torch.bfloat16 else 1e-6
    assert ((kv[:, 16:] - k_r.to(dtype).float()).abs() <= step / 2 * (1 + 1e-5) + k_r.abs() * rounding).all()
    assert (kv[:, :16] - c.to(dtype).float()).abs().max() <= c.abs().max() / 127 / 2 + c.abs().max() * rounding


def test_int8_scale_is_max_abs_over_127():
    c = torch.tensor([[0.5, -2.54, 1.0]])
    q, scale = quantize_latent(c, "int8")
    assert scale.item() == pytest.approx(2.54 / 127)
    assert q.tolist() == [[25, -127, 50]]
    assert torch.allclose(dequantize_latent(q, scale, "int8", torch.float32), c, atol=scale.item() / 2)
