"""The native decode over a transform-coded layer (kernels/attention.py mla_decode_coded, attention/native_backend.py
coded_latent_attention) against the reference backend, which dequantizes the same cache (cache/coded.py
decode): every path this machine runs (on AVX-512 32 columns at a time, or run by run), float32 and bf16 rows,
one and several query tokens, the same bits alone as batched."""

from __future__ import annotations

import random

import pytest
import torch

from latentkv.attention.metadata import build_metadata
from latentkv.attention.native_backend import coded_latent_attention
from latentkv.attention.paged import write
from latentkv.attention.torch_ref import TorchBackend
from latentkv.cache import coded
from latentkv.cache.coded import LayerCode
from latentkv.cache.latent_cache import LatentCache
from latentkv.facts import TRANSFORM_CODE
from latentkv.kernels import attention as attention_kernels
from latentkv.kernels.attention import coded_runs, mla_decode_coded
from latentkv.rope import cos_sin

pytestmark = pytest.mark.skipif(
    not attention_kernels.available(), reason=f"native backend not built: {attention_kernels.unavailable_reason()}"
)

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # of the largest output value (measured: 5e-7, 1e-2)
RANK, DR, HEADS, BS = 40, 16, 4, 16


def layer_code(seed: int, centred: bool = True, group: int = 8) -> LayerCode:
    """Bits 0-8 over a latent of RANK and a rope key of DR, two frequencies repeated (the kernel keeps one
    cos and sin per distinct frequency), a YaRN-like factor on cos / sin."""
    rng = random.Random(seed)
    latent = tuple(rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 8)) for _ in range(RANK))
    rope = tuple(rng.choice((0, 2, 5, 8)) for _ in range(DR))
    freqs = [1.0, 0.3, 0.1, 0.03, 0.01, 0.3, 0.003, 1.0]  # DR / 2, two of them twice
    means = (
        tuple(rng.uniform(-0.3, 0.3) for _ in range(RANK)) if centred else None,
        tuple(rng.uniform(-1, 1) for _ in range(DR)) if centred else None,
    )
    return LayerCode(latent, rope, group, *means, tuple(freqs), 1.1)


def filled(code, lengths, dtype, seed=0):
    """A coded cache holding random rows of sequences of `lengths` on shuffled blocks -> (cache, tables)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // BS) for n in lengths]
    ids = list(range(1, sum(need) + 2))
    random.Random(seed).shuffle(ids)
    tables, at = [], 0
    for n in need:
        tables.append(ids[at : at + n])
        at += n
    cache = LatentCache(len(ids) + 1, BS, RANK, DR, dtype, TRANSFORM_CODE, code=code)
    for n, table in zip(lengths, tables):
        pos = torch.arange(n)
        c = torch.randn(n, RANK, generator=gen) * torch.logspace(0.5, -1, RANK)
        cos, sin = cos_sin(pos, torch.tensor(code.inv_freq))
        angles = (cos * code.rope_factor, sin * code.rope_factor)
        k_r = torch.randn(n, DR, generator=gen)
        slots = torch.tensor(table)[pos // BS] * BS + pos % BS
        write(cache, c.to(dtype), k_r.to(dtype), slots, angles)
    return cache, tables


def query_for(lengths, q_len, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(len(lengths), q_len * HEADS, RANK + DR, generator=gen) * 0.4).to(dtype)


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("centred", [True, False])
def test_every_path_reads_the_codes_as_the_reference_dequantizes_them(isa, dtype, centred):
    code = layer_code(3, centred)
    lengths = [1, 17, 300, 45]  # one token, mid-block ends, two spans
    cache, tables = filled(code, lengths, dtype)
    meta, _ = build_metadata([1] * len(lengths), lengths, tables, BS, split=False)
    query = query_for(lengths, 1, dtype)
    got = coded_latent_attention(query, cache, meta, path=isa)
    want = TorchBackend().whole_latent_attention(query, cache, meta).float()
    assert got.dtype == dtype and got.shape == want.shape == (len(lengths), HEADS, RANK)
    err = ((got.float() - want).abs().max() / want.abs().max()).item()
    assert err <= TOL[dtype], f"{isa} {dtype}: {err:.2e}"


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
def test_every_width_is_read_at_every_bit_offset(isa):
    """Each width's runs start at each of the 8 bit offsets in turn (a run of 8-bit codes off a byte boundary
    spans 9 bytes; one of 16 values, 17)."""
    for lead in range(8):
        for b in range(2, 9):
            latent = (1,) * lead + (b,) * 31 + (0,) * (RANK - 31 - lead)
            code = LayerCode(latent, (7,) * DR, 64, None, None, tuple([0.1] * (DR // 2)), 1.0)
            lengths = [20, 3]
            cache, tables = filled(code, lengths, torch.float32, seed=lead)
            meta, _ = build_metadata([1, 1], lengths, tables, BS, split=False)
            query = query_for(lengths, 1, torch.float32)
            got = coded_latent_attention(query, cache, meta, path=isa)
            want = TorchBackend().whole_latent_attention(query, cache, meta)
            assert ((got - want).abs().max() / want.abs().max()).item() <= TOL[torch.float32], (lead, b)


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_scale_groups_than_a_chunk_reads_take_the_runs(isa, dtype):
    """On AVX-512 a token's columns are read 32 at a time where its scale groups fit two vectors (32); a
    code of more groups (here one a value) is read run by run, on every path as the reference reads it."""
    code = layer_code(9, group=1)
    assert len(code.widths) > 32  # (one group a stored value)
    lengths = [70, 9]
    cache, tables = filled(code, lengths, dtype, seed=6)
    meta, _ = build_metadata([1, 1], lengths, tables, BS, split=False)
    query = query_for(lengths, 1, dtype)
    got = coded_latent_attention(query, cache, meta, path=isa).float()
    want = TorchBackend().whole_latent_attention(query, cache, meta).float()
    assert ((got - want).abs().max() / want.abs().max()).item() <= TOL[dtype]


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
def test_several_query_tokens_see_their_own_positions(isa):
    code = layer_code(5, group=64)
    lengths = [40, 23]
    cache, tables = filled(code, lengths, torch.float32, seed=2)
    meta, _ = build_metadata([3, 2], lengths, tables, BS, split=False)
    query = query_for(lengths, meta.max_query_len, torch.float32)
    got = coded_latent_attention(query, cache, meta, path=isa)
    want = TorchBackend().whole_latent_attention(query, cache, meta)
    valid = meta.query_valid.repeat_interleave(HEADS, dim=1)
    assert ((got - want).abs()[valid].max() / want.abs().max()).item() <= TOL[torch.float32]


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sequence_gets_the_same_bits_alone_and_batched(isa, dtype):
    code = layer_code(7)
    lengths = [290, 33, 5]
    cache, tables = filled(code, lengths, dtype, seed=4)
    meta, _ = build_metadata([1] * 3, lengths, tables, BS, split=False)
    query = query_for(lengths, 1, dtype)
    batched = coded_latent_attention(query, cache, meta, path=isa)
    for b in range(3):
        alone, _ = build_metadata([1], [lengths[b]], [tables[b]], BS, split=False)
        assert torch.equal(coded_latent_attention(query[b : b + 1], cache, alone, path=isa)[0], batched[b])


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_of_any_width_reads_as_on_the_scalar_path(isa, dtype):
    """The kernel called with a row whose width is no multiple of 32 (33 values and 2 cos / sin columns;
    kernel_view pads its rows, a direct caller need not): where a 32-column chunk would pass the row's
    end the runs read it, and every path gives the scalar path's output within float noise."""
    groups = [(3, 20, 0.586, 0), (7, 13, 0.057, 20)]
    runs, steps = coded_runs(groups)
    gen = torch.Generator().manual_seed(8)
    code_bytes = -(-sum(b * n for b, n, _, _ in groups) // 8)
    codes = torch.randint(0, 256, (5, BS, code_bytes), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(5, BS, len(groups), generator=gen) + 0.5).half()
    cs = torch.randn(64, 2, generator=gen)
    tables, lens = torch.tensor([[4, 2, 1], [3, 0, 0]]), torch.tensor([40, 9])
    query = (torch.randn(2, HEADS, 35, generator=gen) * 0.3).to(dtype)
    got = mla_decode_coded(query, codes, scales, runs, steps, cs, 33, tables, lens, None, HEADS, isa).float()
    want = mla_decode_coded(query, codes, scales, runs, steps, cs, 33, tables, lens, None, HEADS, "scalar").float()
    assert ((got - want).abs().max() / want.abs().max()).item() <= TOL[dtype]


def test_the_runs_cover_every_code_once_inside_its_load():
    """coded_runs: each stored value in exactly one run, at its bit offset, no run reading past 64 bits."""
    code = layer_code(11)
    view = coded.kernel_view(code)
    widths, seen = code.widths, {}
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    for byte, shift, bits, count, col, _ in view.runs.tolist():
        assert shift < 8 and shift + bits * count <= 128 and 1 <= count <= 16
        for i in range(count):
            seen[col + i] = 8 * byte + shift + i * bits
    columns = sorted(seen)
    assert [seen[c] for c in columns] == offsets  # packed order, back to back
    latent = sum(1 for b in code.latent_bits if b)
    assert columns[:latent] == list(range(latent)) and columns[latent] == view.latent_columns
    assert view.latent_columns % 32 == 0 and view.query_map.shape[0] % 32 == 0
