"""The native CPU kernel (paged MLA decode) against the reference backend and exact float64 math.

Tolerances, as error / max|exact output| (exact = float64 attention over the same stored values:
the same bf16 rows, the same int8 / fp8 codes and scales):
- native, float32 query and cache: 2e-5 (float32 accumulation, a polynomial exp);
- native, bfloat16 query: 8e-3 (its output is rounded to bf16 once: 2^-8 relative). On the
  avx512_bf16 path the scores are bf16 x bf16 dot products (exact products, float32 sums) and the
  value weights p (x the token's scale for int8 / fp8) are rounded to bf16 (2^-9 relative):
  measured <= 2.7e-3 over a bf16 latent, <= 4.7e-3 over fp8, against 2.7e-3 on float32 FMAs
  (rank % 32 == 16, e.g. 240: the chunk the latent ends in is taken in two masked halves, the
  token's scale between them);
  An int8 latent there (rank % 64 == 0, bf16 rope) takes integer dot products (VNNI): the query's
  latent part as two int8 parts hi + lo/256 per row (one part alone measured 3-5e-2), the value
  weights as uint8 per tile: measured <= 3.3e-3; an int8 latent and rope (widths % 64 == 0) on AMX
  takes int8 tile products with the query in the same two parts, its value weights bf16 as above:
  measured <= 4.9e-3 (the avx512_bf16 path <= 4.1e-3 on the same inputs);
- q4_0 (float16 scales per 32 values, the rope key turned): the same tolerances, the exact output
  taken over the stored (turned) rope key with the turned query;
- reference vs native: 1e-4 in float32; 5e-2 in bfloat16 (the reference rounds its scores,
  probabilities and dequantized latent to bf16 before the matmuls).
"""

import random
import time
import types

import pytest
import torch

from latentkv.kernels import attention as attention_kernels, build
from latentkv.attention.metadata import build_metadata
from latentkv.attention.torch_ref import TorchBackend
from latentkv.cache import q4
from latentkv.cache.latent_cache import LatentCache
from latentkv.attention.paged import write

pytestmark = pytest.mark.skipif(
    not attention_kernels.available(), reason=f"native backend not built: {attention_kernels.unavailable_reason()}"
)

NATIVE_TOL = {torch.float32: 2e-5, torch.bfloat16: 8e-3}
REFERENCE_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def filled_cache(lengths, heads, rank, rope, dtype, cache_dtype, block_size, seed):
    """A cache holding random latents for sequences of `lengths` on shuffled blocks.
    -> cache, block tables (out of order), exact rows [B][L_b, r + dr] float64."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    ids = list(range(1, sum(need) + 3))  # block 0 and two spare blocks stay unused
    random.Random(seed).shuffle(ids)
    tables, at = [], 0
    for n in need:
        tables.append(ids[at : at + n])
        at += n
    cache = LatentCache(len(ids) + 1, block_size, rank, rope, dtype, cache_dtype)
    if cache_dtype == "auto":  # garbage in unused slots must not leak into any sum
        cache.kv.normal_(generator=gen).mul_(100)
    exact = []
    for n, table in zip(lengths, tables):
        c = torch.randn(n, rank, generator=gen) * (1 + torch.rand(n, 1, generator=gen) * 3)
        k_r = torch.randn(n, rope, generator=gen)
        pos = torch.arange(n)
        slots = torch.tensor(table)[pos // block_size] * block_size + pos % block_size
        write(cache, c.to(dtype), k_r.to(dtype), slots)
        exact.append(stored_rows(cache, slots))
    return cache, tables, exact


def stored_rows(cache, slots):
    """What the cache holds at `slots`, exactly, in float64 -> [n, r + dr] (q4_0: the rope key as
    stored, turned)."""
    if cache.q4:
        n, split = cache.latent.shape[0] * cache.block_size, q4.groups(cache.kv_rank)
        scale = cache.scale.view(n, -1)[slots]
        latent = q4.dequantize(cache.latent.view(n, -1)[slots], scale[:, :split], cache.kv_rank, torch.float64)
        rope = q4.dequantize(cache.rope.view(n, -1)[slots], scale[:, split:], cache.rope_dim, torch.float64)
        return torch.cat((latent, rope), dim=-1)
    if not cache.quantized:
        return cache.kv.view(-1, cache.kv.shape[-1])[slots].double()
    codes = cache.latent.view(-1, cache.kv_rank)[slots]
    values = codes.double() if cache.latent_dtype == "int8" else codes.view(torch.float8_e4m3fn).double()
    n = cache.latent.shape[0] * cache.block_size
    scale = cache.scale.view(n, -1)[slots].double()
    rope = cache.rope.view(n, cache.rope_dim)[slots].double()
    if cache.rope8:  # codes times the token's rope scale, in the model dtype (as the kernels widen them)
        rope = (rope * scale[:, 1:]).to(cache.dtype).double()
    return torch.cat((values * scale[:, :1], rope), dim=-1)


def kernel_query(query, cache):
    """The query the kernel takes: a q4_0 cache's rope key is stored turned, so the query's rope
    part is turned too (as attention/native_backend.py does)."""
    if not cache.q4:
        return query
    return torch.cat((query[..., : cache.kv_rank], q4.turn(query[..., cache.kv_rank :])), dim=-1)


def exact_attention(query, rows, query_lens, lengths, heads):
    """float64 softmax attention of each row over its visible keys -> [B, M, r]."""
    out = torch.zeros(query.shape[0], query.shape[1], rows[0].shape[1], dtype=torch.float64)
    for b, (kv, q_len, n) in enumerate(zip(rows, query_lens, lengths)):
        for m in range(query.shape[1]):
            qi = m // heads
            visible = n - q_len + qi + 1 if qi < q_len else 1
            probs = (query[b, m].double() @ kv[:visible].T).softmax(-1)
            out[b, m] = probs @ kv[:visible]
    return out


def run_case(
    lengths, heads, rank, rope, dtype, cache_dtype, block_size=16, query_lens=None, isa=None, seed=0, zero_latent=None
):
    """zero_latent: a bool mask [B, Q*H] of query rows whose latent part is zero (an exact conversion's)."""
    query_lens = query_lens or [1] * len(lengths)
    cache, tables, rows = filled_cache(lengths, heads, rank, rope, dtype, cache_dtype, block_size, seed)
    meta, _ = build_metadata(query_lens, lengths, tables, block_size, split=False)
    q_max = meta.max_query_len
    gen = torch.Generator().manual_seed(seed + 1)
    query = (torch.randn(len(lengths), q_max * heads, rank + rope, generator=gen) * (rank + rope) ** -0.5 * 2).to(dtype)
    if zero_latent is not None:
        query[..., :rank][zero_latent] = 0
    pos = None if q_max == 1 else meta.query_pos
    turned = kernel_query(query, cache)
    got = attention_kernels.mla_decode(turned, cache, meta.block_tables, meta.context_lens, pos, heads, path=isa)
    reference = TorchBackend().latent_attention(query, cache, meta)  # reads the rope key turned back
    exact = exact_attention(turned, rows, query_lens, lengths, heads)[..., :rank]
    valid = meta.query_valid.repeat_interleave(heads, dim=1)  # padded query rows are dropped by the caller
    scale = exact.abs().max()
    assert got.dtype == dtype and got.shape == (len(lengths), q_max * heads, rank)
    err_native = ((got.double() - exact).abs()[valid].max() / scale).item()
    err_reference = ((got.double() - reference.double()).abs()[valid].max() / scale).item()
    assert err_native <= NATIVE_TOL[dtype], f"native vs exact: {err_native:.2e}"
    assert err_reference <= REFERENCE_TOL[dtype], f"native vs reference: {err_reference:.2e}"


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [
        (torch.float32, "auto"),
        (torch.bfloat16, "auto"),
        (torch.bfloat16, "int8"),
        (torch.bfloat16, "fp8_e4m3"),
        (torch.float32, "int8"),
        (torch.bfloat16, "int8_rope8"),
        (torch.float32, "fp8_e4m3_rope8"),
        (torch.float32, "q4_0"),
        (torch.bfloat16, "q4_0"),
    ],
)
def test_batch_of_lengths_ending_mid_block_every_isa(isa, dtype, cache_dtype):
    run_case([1, 17, 300, 45], heads=9, rank=64, rope=32, dtype=dtype, cache_dtype=cache_dtype, isa=isa)


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.bfloat16, "auto"), (torch.bfloat16, "int8"), (torch.bfloat16, "int8_rope8"), (torch.float32, "int8_rope8")],
)
@pytest.mark.parametrize("rank", [192, 240])  # 240: the latent ends mid-chunk (scored in full)
def test_rows_whose_latent_query_is_zero_score_the_rope_key_alone(isa, dtype, cache_dtype, rank):
    """An exact conversion's query has a zero latent part (W_UK all zero): the kernel may skip the
    latent's scores for a group of rows that are all such, and only then. Sequence 0: every row
    zero; sequence 1: rows 0, 4 and 8 (one per group of three) nonzero; sequence 2: none zero."""
    zero = torch.zeros(3, 9, dtype=torch.bool)
    zero[0] = True
    zero[1] = True
    zero[1, [0, 4, 8]] = False
    run_case(
        [300, 45, 70], heads=9, rank=rank, rope=192, dtype=dtype, cache_dtype=cache_dtype, isa=isa, zero_latent=zero
    )


@pytest.mark.parametrize(
    "heads,rank,rope",
    [
        (1, 32, 0),
        (16, 512, 64),
        (128, 128, 16),
        (3, 256, 64),
        (2, 48, 8),
        (9, 248, 96),
        (9, 240, 96),
        (5, 44, 6),
        (4, 37, 3),
    ],
)  # widths off the vector lanes
@pytest.mark.parametrize("cache_dtype", ["auto", "int8", "fp8_e4m3", "int8_rope8", "q4_0"])  # q4_0: odd widths too
def test_heads_ranks_and_rope_widths(heads, rank, rope, cache_dtype):
    run_case([33, 130], heads=heads, rank=rank, rope=rope, dtype=torch.bfloat16, cache_dtype=cache_dtype, seed=heads)


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.float32, "auto"), (torch.float32, "fp8_e4m3"), (torch.bfloat16, "auto"), (torch.bfloat16, "int8")],
)
def test_long_context_split_across_threads_is_merged_exactly(dtype, cache_dtype):
    """5,000 tokens: many spans (a log-sum-exp merge) on several threads."""
    run_case([5000, 3], heads=4, rank=64, rope=16, dtype=dtype, cache_dtype=cache_dtype, block_size=32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_several_query_tokens_are_causal(dtype):
    """Q > 1 (a short chunk): each query row sees keys up to its own position only."""
    run_case([40, 9, 70], heads=5, rank=32, rope=8, dtype=dtype, cache_dtype="auto", query_lens=[4, 1, 3], block_size=8)


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [
        (torch.bfloat16, "auto"),
        (torch.bfloat16, "int8"),
        (torch.bfloat16, "fp8_e4m3"),
        (torch.float32, "int8"),
        (torch.bfloat16, "int8_rope8"),
        (torch.bfloat16, "q4_0"),
    ],
)
@pytest.mark.parametrize("rank,rope", [(64, 16), (240, 96)])  # 240: the latent ends mid-chunk (the default conversion)
def test_result_does_not_depend_on_the_batch_or_threads(isa, dtype, cache_dtype, rank, rope):
    """Batch invariance: a sequence's output is bit-identical alone, in a batch of mixed lengths
    (short, mid-block, several spans long), and on 1 or 2 threads (the split into spans depends
    only on the sequence's own length; the merge runs in span order)."""
    assert_batch_invariant(isa, dtype, cache_dtype, rank, rope)


def assert_batch_invariant(isa, dtype, cache_dtype, rank, rope, heads=8):
    lengths = [700, 20, 3001, 1]
    cache, tables, _ = filled_cache(lengths, heads, rank, rope, dtype, cache_dtype, 16, seed=3)
    query = torch.randn(len(lengths), heads, rank + rope, generator=torch.Generator().manual_seed(4)).to(dtype)
    meta, _ = build_metadata([1] * len(lengths), lengths, tables, 16)
    batched = {
        t: attention_kernels.mla_decode(
            query, cache, meta.block_tables, meta.context_lens, heads=heads, path=isa, threads=t
        )
        for t in (1, 2)
    }
    assert torch.equal(batched[1], batched[2])
    for b in range(len(lengths)):
        alone, _ = build_metadata([1], lengths[b : b + 1], tables[b : b + 1], 16)
        for t in (1, 2):
            one = attention_kernels.mla_decode(
                query[b : b + 1], cache, alone.block_tables, alone.context_lens, heads=heads, path=isa, threads=t
            )
            assert torch.equal(one[0], batched[2][b]), (b, t)


@pytest.mark.parametrize("isa", attention_kernels.supported_isas())
@pytest.mark.parametrize("heads,rank,rope,block_size", [(9, 192, 192, 16), (20, 128, 64, 32), (9, 64, 128, 8)])
def test_int8_latent_and_rope_in_whole_int8_steps(isa, heads, rank, rope, block_size):
    """An int8_rope8 cache whose latent and rope widths are multiples of 64: on AMX the scores are
    int8 tile products of the codes where they lie (block size 8: the rows copied first) with the
    query in two int8 parts. Mid-block and multi-span lengths, 20 heads (two row groups), several
    query tokens; batch-invariant."""
    run_case(
        [1, 17, 300, 45, 700],
        heads=heads,
        rank=rank,
        rope=rope,
        dtype=torch.bfloat16,
        cache_dtype="int8_rope8",
        block_size=block_size,
        isa=isa,
    )
    run_case(
        [40, 9, 70],
        heads=heads,
        rank=rank,
        rope=rope,
        dtype=torch.bfloat16,
        cache_dtype="int8_rope8",
        block_size=block_size,
        query_lens=[4, 1, 3],
        isa=isa,
        seed=1,
    )
    assert_batch_invariant(isa, torch.bfloat16, "int8_rope8", rank, rope, heads=heads)


def test_a_build_started_in_the_background_is_waited_for_not_skipped(monkeypatch):
    """extension() called while build_in_background's thread is still compiling must wait for
    that build (and not compile twice, nor report the backend unavailable meanwhile)."""
    calls = []
    module = types.SimpleNamespace(
        capabilities=lambda: [(name, 1 << i) for i, name in enumerate(build.CAPS)],
        cpu_capabilities=lambda: 0,
        paths=lambda: [],
    )

    def slow_compile(name, source, directory):
        calls.append(name)
        time.sleep(0.3)
        return module

    monkeypatch.setattr(attention_kernels.EXT, "state", {})
    monkeypatch.setattr(build, "compile_extension", slow_compile)
    monkeypatch.setattr(build, "self_check", lambda ext, module, paths, runs: {})
    threads = build.build_in_background(attention_kernels.EXT)
    time.sleep(0.05)  # the thread holds the build now
    assert attention_kernels.extension() is module and attention_kernels.available()
    threads[0].join()
    assert calls == ["latentkv_mla_attention"]


def test_the_build_lives_in_the_user_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LATENTKV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LATENTKV_BUILD_DIR", raising=False)
    assert build.build_dir().parent == tmp_path / "torch_extensions"
    monkeypatch.setenv("LATENTKV_BUILD_DIR", str(tmp_path / "builds"))
    assert build.build_dir().parent == tmp_path / "builds"
