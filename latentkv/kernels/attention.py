"""The native attention kernels (csrc/attention/mla_attention.cpp): paged MLA decode and the
batch-invariant prefill span. attention/native_backend.py's NativeBackend decides when they run.

- `mla_decode`: absorbed queries [B, M, r+dr] over one layer's paged latent -> o_lat [B, M, r].
  Paths: amx_int8 (bf16 queries over an int8 latent and rope key in whole tile steps: int8 tiles,
  csrc/attention/mla_decode_amx_i8.h), amx_bf16 (bf16 queries: scores and value sums on AMX tiles,
  mla_decode_amx.h), avx512_bf16 (bf16 queries: vdpbf16ps, mla_decode_bf16.h; an int8 latent of a
  rank that is a multiple of 64: vpdpbusd, mla_decode_vnni.h, where the CPU lacks amx_bf16), avx512 and scalar
  (float32 FMAs, mla_decode_impl.h), avx2 (intrinsics, mla_decode_avx2.h). A sequence's keys are cut
  into work items of DECODE_SPAN tokens at fixed positions for contexts up to DECODE_SPAN x
  DECODE_MAX_SPANS tokens (longer ones: at most DECODE_MAX_SPANS items), merged in order: the same bits
  alone, batched, on any thread count.
- `mla_decode_coded`: the same over a transform-coded layer (cache/coded.py): each token's mixed-width codes
  widened in runs of up to 16 values of one width (`coded_runs`; on AVX-512 one byte shuffle and one shift
  a run) into the float32 or bf16 tile of every path; the
  query arrives turned into the code's groups (attention/native_backend.py CodedBackend).
- `mla_prefill`: one span of attention/prefill.py's span_prefill, for PREFILL_DTYPES on every ISA:
  float32 FMAs at the ISA's width (mla_prefill_f32.h; bf16 tensors widened), bf16 dot products for
  bf16 on avx512_bf16 (mla_prefill_bf16.h), AMX tiles on amx_bf16 (mla_prefill_amx.h).
Each path's loops are a unit of their own under its target (csrc/attention/attention_<isa>.cpp, the table in
mla_paths.h); mla_attention.cpp holds the entries and picks the loops. Every entry takes the capabilities
that serve (EXT.caps, kernels/build.py), or a named path's (`path`); `mla_decode` takes the cache's format
as a code too (`cache_kind`: csrc/attention/cache_kinds.h), which the kernel checks the tensors against.
LATENTKV_NATIVE=0 switches the extension off (the PyTorch reference backend then serves).
"""

from __future__ import annotations

import functools

import torch

from .build import Extension

PREFILL_DTYPES = (torch.float32, torch.bfloat16)
DECODE_SPAN, DECODE_MAX_SPANS = 256, 64  # csrc/attention/mla_job.h SPAN, MAX_SPANS (tests/test_docs_facts.py)
FLOAT_PATHS = ("scalar", "avx2", "avx512")  # the paths with float32 loops of their own (the others run avx512's)


@functools.cache
def cache_kind(storage: str) -> int:
    """The code `mla_decode` (and the decode plan) takes for a cache stored as `storage` (cache/format.py
    CacheFormat.storage): its index among the kernel's cache kinds (csrc/attention/cache_kinds.h, the
    module's cache_kinds()). One the kernel does not read is an error naming those it does."""
    kinds = extension().cache_kinds()
    if storage not in kinds:
        raise ValueError(f"the native decode kernel reads no {storage} cache: it reads {kinds}")
    return kinds.index(storage)


def probe(module, caps: int) -> list:
    """The self-check's inputs (kernels/build.py): decode over float32, bf16, int8 (an int8 rope key
    too, and both 64 wide) and q4_0 caches with float32 and bf16 queries (one and two query tokens), a latent
    rank that ends mid-chunk, and a
    prefill span in both dtypes with keys packed and read in place, one rope key for all heads or one per group,
    kv rows per head or per group."""
    gen = torch.Generator().manual_seed(0)
    heads, rank, dr, bs = 4, 64, 16, 16
    tables = torch.tensor([[0, 2, 4], [1, 3, 5]])
    lens = torch.tensor([40, 17])
    kv = torch.randn(6, bs, rank + dr, generator=gen)
    latent = torch.randint(-127, 128, (6, bs, rank), generator=gen, dtype=torch.int8)
    scale = torch.rand(6, bs, generator=gen) / 64
    rope = torch.randn(6, bs, dr, generator=gen).bfloat16()
    rope8 = torch.randint(-127, 128, (6, bs, dr), generator=gen, dtype=torch.int8)
    scale2 = torch.rand(6, bs, 2, generator=gen) / 64  # an 8-bit rope: [latent's, rope's] scale per token
    # q4_0 blocks (cache/q4.py): packed codes, float16 scales per 32 values (two latent groups, one rope)
    q4_latent = torch.randint(0, 256, (6, bs, rank // 2), generator=gen, dtype=torch.uint8)
    q4_rope = torch.randint(0, 256, (6, bs, dr // 2), generator=gen, dtype=torch.uint8)
    q4_scale = (torch.randn(6, bs, 3, generator=gen) / 64).half()
    empty = torch.empty(0)
    kind = {name: code for code, name in enumerate(module.cache_kinds())}
    out = []
    for q_len in (1, 2):
        query = torch.randn(2, q_len * heads, rank + dr, generator=gen)
        pos = torch.tensor([[39, 38], [16, 15]])[:, :q_len] if q_len > 1 else torch.empty(0, dtype=torch.long)
        for qdt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            q = query.to(qdt)
            for name, caches, code in (
                ("kv", (kv.to(qdt), empty, empty, empty), kind[f"kv_{str(qdt).removeprefix('torch.')}"]),
                ("int8", (empty, latent, scale, rope), kind["int8_bfloat16"]),
                ("int8 rope8", (empty, latent, scale2, rope8), kind["int8_int8"]),
                ("q4_0", (empty, q4_latent, q4_scale, q4_rope), kind["q4_0"]),
            ):
                got = module.mla_decode(q, *caches, code, tables, lens, pos, heads, rank, bs, caps, 1)
                out.append((f"mla_decode {qdt} {name} Q={q_len}", got, tol))
    # a transform-coded layer: groups of 1-8 bits, runs that straddle bytes and end at the codes' last byte
    groups = [(3, 20, 0.586, 0), (5, 8, 0.188, 20), (8, 13, 0.031, 28), (2, 10, 0.996, 48), (1, 3, 1.596, 58)]
    runs, steps = coded_runs(groups)  # 41 latent values, 7 columns of padding, the rope key's 13
    code_bytes = -(-sum(b * n for b, n, _, _ in groups) // 8)
    codes = torch.randint(0, 256, (6, bs, code_bytes), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(6, bs, len(groups), generator=gen) + 0.5).half()
    cs = torch.randn(64, 8, generator=gen)
    values = 61
    for q_len in (1, 2):
        query = torch.randn(2, q_len * heads, values + 8, generator=gen)
        query[..., 41:48] = 0  # the padding's columns: junk in the widened rows, weight 0
        pos = torch.tensor([[39, 38], [16, 15]])[:, :q_len] if q_len > 1 else torch.empty(0, dtype=torch.long)
        for qdt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):  # bf16: the dot-product and tile loops
            got = module.mla_decode_coded(
                query.to(qdt), codes, scales, runs, steps, cs, 48, tables, lens, pos, heads, bs, caps, 1
            )
            out.append((f"mla_decode_coded {qdt} Q={q_len}", got[..., :41], tol))
    # a latent that ends mid-chunk (rank % 32 == 16, as the default conversion's 240): bf16 queries
    # over a bf16 and an int8 cache take the chunk in two halves (mla_decode_bf16.h)
    rank16, dr16 = 48, 16
    kv16 = torch.randn(6, bs, rank16 + dr16, generator=gen)
    latent16 = torch.randint(-127, 128, (6, bs, rank16), generator=gen, dtype=torch.int8)
    rope16 = torch.randn(6, bs, dr16, generator=gen).bfloat16()
    q16 = torch.randn(2, heads, rank16 + dr16, generator=gen).bfloat16()
    for name, caches, code in (
        ("kv", (kv16.bfloat16(), empty, empty, empty), kind["kv_bfloat16"]),
        ("int8", (empty, latent16, scale, rope16), kind["int8_bfloat16"]),
    ):
        got = module.mla_decode(q16, *caches, code, tables, lens, empty.long(), heads, rank16, bs, caps, 1)
        out.append((f"mla_decode rank {rank16} {name}", got, 3e-2))
    # an int8 latent and rope in whole int8 tile steps (64 wide): on AMX, int8 tile products (mla_decode_amx_i8.h)
    rope64 = torch.randint(-127, 128, (6, bs, 64), generator=gen, dtype=torch.int8)
    q64 = torch.randn(2, heads, rank + 64, generator=gen).bfloat16()
    args = (empty, latent, scale2, rope64, kind["int8_int8"], tables, lens, empty.long(), heads, rank, bs, caps, 1)
    got = module.mla_decode(q64, *args)
    out.append(("mla_decode int8 rope8 64 + 64", got, 3e-2))
    n, dv, span = 5, 16, 64
    # dn 16 + dr 16: the AMX kernel packs the keys; dn 16 + dr 32: it reads them in place (its
    # second nope step over the values, against zero query pairs); grouped rope keys [S, 2, dr]
    # (two heads each, model/rope_groups.py) read in place and packed; kv rows one per two heads
    # (MLAttention.kv_groups), with a nope part and without (a converted GQA model's values alone)
    for dn, dr_p, groups, kv_heads in (
        (16, dr, 1, heads),
        (16, 32, 1, heads),
        (16, 32, 2, heads),
        (16, dr, 2, heads),
        (16, 32, 2, 2),
        (0, 32, 2, 2),
    ):
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            q = torch.randn(n, heads, dn + dr_p, generator=gen).to(dt)
            keys = torch.randn(span, kv_heads, dn + dv, generator=gen).to(dt)
            k_r = (
                torch.randn(span, dr_p, generator=gen).to(dt)
                if groups == 1
                else torch.randn(span, groups, dr_p, generator=gen).to(dt)
            )
            m, l, acc = torch.full((n, heads), float("-inf")), torch.zeros(n, heads), torch.zeros(n, heads, 16)
            module.mla_prefill(q, keys, k_r, dn, 50, 0, m, l, acc, 0.2, caps, 1)
            out.append(
                (f"mla_prefill {dt} dn {dn} dr {dr_p} rope keys {groups} kv heads {kv_heads}", acc / l[..., None], tol)
            )
    return out


EXT = Extension(
    "attention",
    "latentkv_mla_attention",
    "mla_attention.cpp",
    "LATENTKV_NATIVE",
    "the native CPU attention kernel is",
    "the PyTorch reference backend",
    probe,
)


def extension():
    """The compiled module, or None (the reason in `unavailable_reason()`); built once per process."""
    return EXT.module()


def available() -> bool:
    return EXT.available()


def unavailable_reason() -> str | None:
    return EXT.unavailable_reason()


def supported_isas() -> list[str]:
    return EXT.supported_isas()


def chosen_isa() -> str:
    """The best path the capabilities that serve allow (kernels/build.py: chosen when the library loaded)."""
    return EXT.choose()


def kernel_path(dtype: torch.dtype) -> str:
    """The path whose loops run rows of this dtype: bf16 dot products and AMX tiles serve bf16 rows only
    (float32 ones run the avx512 loops there)."""
    path = EXT.choose()
    return "avx512" if dtype != torch.bfloat16 and path not in FLOAT_PATHS else path


def caps_mask(path: str | None) -> int:
    """The mask an entry is handed: the capabilities that serve, or those `path` needs."""
    return (EXT.caps if path is None else EXT.path_caps(path)).mask


def prefill_supported(dtype: torch.dtype) -> bool:
    """Whether the native prefill kernel takes these prompt rows (else the SDPA tiles do)."""
    return dtype in PREFILL_DTYPES


def mla_decode(
    query,
    cache,
    block_tables,
    context_lens,
    query_pos=None,
    heads: int = 1,
    path: str | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """query [B, M, r+dr] (M = Q*heads rows, absorbed and scaled) over one layer's LatentCache ->
    o_lat [B, M, r] in the query dtype. Rows of query token q see keys j <= query_pos[b, q]
    (None: the whole context). A q4_0 cache's rope key is stored turned: the query's must be too
    (attention/native_backend.py). `path`: a named path to run instead of the one that serves."""
    pos = query_pos if query_pos is not None else context_lens.new_empty(0)
    return extension().mla_decode(
        query,
        *cache.kernel_tensors(),  # kv, or latent + scale + rope: the parts of the cache's format
        cache_kind(cache.format.storage),
        block_tables,
        context_lens,
        pos,
        heads,
        cache.kv_rank,
        cache.block_size,
        caps_mask(path),
        threads or torch.get_num_threads(),
    )


TC_RUN = 6  # csrc/attention/mla_job.h TC_RUN: a run's int32 fields


def coded_runs(groups: list[tuple[int, int, float, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A transform code's packed groups (bits, values, step, first column in the widened row) in packed order
    (their codes back to back, no padding) -> the kernel's runs int32 [n, TC_RUN] (byte, shift, bits, count,
    column, group) and steps float32 [n, 2] (step, offset 2^(bits-1) - 1/2): at most 16 values of one
    group a run, all inside the 16 bytes from `byte` (shift < 8)."""
    runs, steps, bit = [], [], 0
    for g, (bits, values, step, col) in enumerate(groups):
        if not 1 <= bits <= 8:
            raise ValueError(f"a coded group of {bits} bits: the kernel reads 1 to 8")
        left = values
        while left:
            byte, shift = divmod(bit, 8)
            count = min(16, left, (128 - shift) // bits)
            runs.append((byte, shift, bits, count, col, g))
            steps.append((step, (1 << (bits - 1)) - 0.5))
            bit, col, left = bit + count * bits, col + count, left - count
    return (
        torch.tensor(runs, dtype=torch.int32).view(-1, TC_RUN),
        torch.tensor(steps, dtype=torch.float32).view(-1, 2),
    )


def mla_decode_coded(
    query,
    codes,
    scales,
    runs,
    steps,
    cs,
    latent_values: int,
    block_tables,
    context_lens,
    query_pos=None,
    heads: int = 1,
    path: str | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """query [B, M, values + cs width] float32 or bf16 (turned into the code's groups; its last columns weigh
    cos and sin of each key's position, cs [positions, cs width] float32) over one transform-coded layer:
    codes uint8 [blocks, bs, code bytes], scales float16 [blocks, bs, groups], read by `coded_runs`' runs
    and steps -> [B, M, latent_values] in the query dtype, in the turned basis (the layer's turned W_UV takes
    it as it is: attention/native_backend.py CodedBackend; coded_latent_attention turns it back).
    query_pos, heads, path, threads: as mla_decode."""
    pos = query_pos if query_pos is not None else context_lens.new_empty(0)
    return extension().mla_decode_coded(
        query,
        codes,
        scales,
        runs,
        steps,
        cs,
        latent_values,
        block_tables,
        context_lens,
        pos,
        heads,
        codes.shape[1],
        caps_mask(path),
        threads or torch.get_num_threads(),
    )


def prefill_finish(acc, l, out) -> None:
    """out [n, H, dv] (contiguous, float32 or bf16) = acc [n, H, :dv] / l [n, H] in out's dtype, one pass:
    the bits of (acc[..., :dv] / l[..., None]).to(out.dtype)."""
    extension().prefill_finish(acc, l, out)


def mla_prefill(
    q, kv, k_r, dn: int, first: int, key_start: int, m, l, acc, scale: float, path: str | None = None
) -> None:
    """One span of the invariant prefill (attention/prefill.py span_prefill has the contract)."""
    extension().mla_prefill(
        q, kv, k_r, dn, first, key_start, m, l, acc, scale, caps_mask(path), torch.get_num_threads()
    )
