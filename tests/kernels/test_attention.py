"""kernels/attention.py: prefill_finish is the bits of torch's (acc[..., :dv] / l).to(dtype), written into a
view; the decode kernel takes a cache's format as a code (cache_kind) and checks the tensors against it."""

import pytest
import torch

from latentkv.cache.format import cache_format
from latentkv.cache.latent_cache import LatentCache
from latentkv.facts import CACHE_DTYPES
from latentkv.kernels import attention

pytestmark = pytest.mark.skipif(not attention.available(), reason="the native attention kernels are not built here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_prefill_finish_is_torchs_division_and_rounding(dtype):
    gen = torch.Generator().manual_seed(0)
    acc = torch.randn(37, 3, 80, generator=gen) * 1e3
    acc[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 3e38])
    l = torch.rand(37, 3, generator=gen) + 1e-3
    l[1, 2] = 0.0
    out = torch.full((40, 3, 70), -7.0).to(dtype)
    attention.prefill_finish(acc, l, out[2:39])
    expected = (acc[..., :70] / l[..., None]).to(dtype)
    assert torch.equal(
        out[2:39].view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[1:],
        expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[1:],
    )
    torch.testing.assert_close(out[2], expected[0], equal_nan=True, rtol=0, atol=0)
    assert out[:2].eq(-7).all() and out[39:].eq(-7).all()  # nothing outside the view


def test_the_kernel_reads_every_cache_format_the_model_dtypes_make():
    """csrc/attention/cache_kinds.h lists exactly the storages CacheFormat makes for the kernel's dtypes."""
    made = {cache_format(name, dtype).storage for name in CACHE_DTYPES for dtype in (torch.float32, torch.bfloat16)}
    assert sorted(attention.extension().cache_kinds()) == sorted(made)
    with pytest.raises(ValueError, match=r"reads no kv_float16 cache: it reads \['kv_float32'"):
        attention.cache_kind(cache_format("auto", torch.float16).storage)


def decode_args(cache, kind):
    query = torch.randn(1, 2, cache.kv_rank + cache.rope_dim).bfloat16()
    tables, lens = torch.tensor([[0, 1]]), torch.tensor([20])
    return (query, *cache.kernel_tensors(), kind, tables, lens, lens.new_empty(0), 2, cache.kv_rank, 16, 0, 1)


@pytest.mark.parametrize(
    "stored,told,error",
    [
        ("int8", "int8_rope8", "the cache kind int8_int8 holds rope as contiguous Char \\(got BFloat16"),
        ("int8_rope8", "fp8_e4m3_rope8", "the cache kind fp8_e4m3_int8 holds latent as contiguous Byte \\(got Char"),
        ("auto", "int8", "the cache kind int8_bfloat16 has no kv tensor"),
        ("int8", "auto", "the cache kind kv_bfloat16 holds kv as contiguous BFloat16 \\(got Char"),
        ("q4_0", "int8", "the cache kind int8_bfloat16 holds latent as contiguous Char \\(got Byte"),
    ],
)
def test_a_cache_whose_tensors_are_not_its_stated_format_is_refused_naming_both(stored, told, error):
    cache = LatentCache(2, 16, 64, 32, torch.bfloat16, stored)
    kind = attention.cache_kind(cache_format(told, torch.bfloat16).storage)
    with pytest.raises(RuntimeError, match=error):
        attention.extension().mla_decode(*decode_args(cache, kind))
    attention.extension().mla_decode(*decode_args(cache, attention.cache_kind(cache.format.storage)))  # as stored: runs


def test_a_cache_kind_out_of_range_is_refused():
    cache = LatentCache(2, 16, 64, 32, torch.bfloat16, "auto")
    with pytest.raises(RuntimeError, match="cache kind 7 is none of the kernel's \\(0 to 6"):
        attention.extension().mla_decode(*decode_args(cache, 7))
