// latentkv native CPU attention: paged MLA decode (absorbed MQA over the latent cache), and the
// batch-invariant prefill kernel (naive form: float32 FMAs at each ISA's width, mla_prefill_f32.h;
// bf16 dot products on avx512_bf16, mla_prefill_bf16.h).
// Python side: latentkv/kernels/attention.py (build, ISA choice, self-check, fallback: kernels/build.py). Shapes:
//   query [B, M, D] (M = Q*H absorbed query rows, D = kv_rank + rope_dim; bf16 or float32)
//   cache: kv [blocks, bs, D] (bf16/float32) or latent [blocks, bs, r] int8|uint8(fp8 e4m3)
//          + scale [blocks, bs] float32 + rope [blocks, bs, D - r] (bf16/float32), or q4_0 blocks:
//          uint8 latent [blocks, bs, (r+1)/2] + uint8 rope [.., (D-r+1)/2] + float16 scale [.., groups]
//   block_tables [B, nb] int64, context_lens [B] int64, query_pos [B, Q] int64 (or empty:
//   every row sees the whole context) -> out [B, M, r] in the query dtype.
#include "kernel_fns.h"
#include "torch_lite.h"

#include <immintrin.h>
#include <omp.h>

#include "bf16.h"
#include "isa_paths.h"
#include "mla_job.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_avx512 {
#include "exp_poly.h"
#include "mla_decode_impl.h"
#include "mla_prefill_f32.h"
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {  // float32 queries: intrinsics, three heads per pass (mla_decode_avx2.h)
#include "exp_poly.h"
#include "mla_decode_impl.h"
#include "mla_decode_avx2.h"
#include "mla_prefill_f32.h"
}
#pragma GCC pop_options

#pragma GCC push_options
// amx-tile / amx-bf16: for mla_prefill_amx.h alone, whose functions run only on the amx paths (the
// compiler never emits tile instructions of its own)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,amx-tile,amx-bf16,amx-int8,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_avx512bf16 {  // float32 queries: the avx512 loops; bf16 queries: vdpbf16ps / vpdpbusd (AMX prefill)
#include "exp_poly.h"
#include "mla_decode_impl.h"
#include "mla_decode_bf16.h"
#include "mla_decode_vnni.h"
#include "mla_prefill_bf16.h"
#include "mla_prefill_amx.h"
#include "mla_decode_amx.h"
#include "mla_decode_amx_i8.h"
}
#pragma GCC pop_options

namespace isa_scalar {  // the baseline x86-64 (or any other CPU's) code
#include "exp_poly.h"
#include "mla_decode_impl.h"
#include "mla_prefill_f32.h"
}

// The paths beside scalar, each the capabilities its code's target needs: float32 FMAs at avx2's and
// avx512's widths; bf16 and int8 dot products (avx512_bf16: vdpbf16ps, vpdpbusd); bf16 tiles for the
// prefill and the bf16 decode (amx_bf16); int8 tiles for an int8 latent and rope key (amx_int8).
constexpr int64_t NEEDS_AVX2 = CAP_AVX2, NEEDS_AVX512 = CAP_AVX2 | CAP_AVX512,
                  NEEDS_AVX512_BF16 = NEEDS_AVX512 | CAP_AVX512_VNNI | CAP_AVX512_BF16,
                  NEEDS_AMX_BF16 = NEEDS_AVX512_BF16 | CAP_AMX_BF16, NEEDS_AMX_INT8 = NEEDS_AMX_BF16 | CAP_AMX_INT8;
constexpr IsaPath PATHS[] = {{"avx2", NEEDS_AVX2},
                             {"avx512", NEEDS_AVX512},
                             {"avx512_bf16", NEEDS_AVX512_BF16},
                             {"amx_bf16", NEEDS_AMX_BF16},
                             {"amx_int8", NEEDS_AMX_INT8}};

namespace {

using SpanFn = void (*)(const Job&, int64_t, int64_t, int64_t, const float*, const int64_t*, float*, float*, float*,
                        float*, float*);

SpanFn span_fn(int64_t caps) {
  if (has(caps, NEEDS_AVX512_BF16)) return isa_avx512bf16::attend_span;
  if (has(caps, NEEDS_AVX512)) return isa_avx512::attend_span;
  if (has(caps, NEEDS_AVX2)) return isa_avx2::attend_span_fast;
  return isa_scalar::attend_span;
}

using MergeFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int, float*, float*, uint16_t*);

MergeFn merge_fn(int64_t caps) {
  if (has(caps, NEEDS_AVX512_BF16)) return isa_avx512bf16::merge_row;
  if (has(caps, NEEDS_AVX512)) return isa_avx512::merge_row;
  if (has(caps, NEEDS_AVX2)) return isa_avx2::merge_row;
  return isa_scalar::merge_row;
}

}  // namespace

at::Tensor mla_decode(at::Tensor query, at::Tensor kv, at::Tensor latent, at::Tensor scale,
                         at::Tensor rope, at::Tensor block_tables, at::Tensor context_lens,
                         at::Tensor query_pos, int64_t heads, int64_t kv_rank, int64_t block_size, int64_t caps,
                         int64_t threads) {
  check_caps(caps, "mla_decode");
  TORCH_CHECK(query.dim() == 3, "mla_decode: query must be [B, M, D]");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "mla_decode: query must be float32 or bfloat16");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "mla_decode: block_tables and context_lens must be int64");
  query = query.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  const int64_t B = query.size(0), M = query.size(1), D = query.size(2), r = kv_rank;
  TORCH_CHECK(M % heads == 0, "mla_decode: query rows must be a multiple of the heads");

  Job job{};
  job.M = (int)M, job.D = (int)D, job.r = (int)r, job.bs = (int)block_size;
  job.nb = block_tables.size(1);
  job.block_tables = block_tables.data_ptr<int64_t>();
  if (kv.numel() > 0) {
    TORCH_CHECK(kv.is_contiguous() && kv.size(-1) == D, "mla_decode: kv must be contiguous [blocks, bs, D]");
    TORCH_CHECK(kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kBFloat16,
                "mla_decode: kv must be float32 or bfloat16");
    job.kind = kv.scalar_type() == at::kFloat ? KIND_F32 : KIND_BF16;
    job.kv = kv.data_ptr();
  } else if (scale.scalar_type() == at::kHalf) {  // q4_0 blocks (latentkv/cache/q4.py)
    TORCH_CHECK(latent.is_contiguous() && scale.is_contiguous() && rope.is_contiguous(),
                "mla_decode: latent, scale and rope must be contiguous");
    const int64_t dr = D - r, groups = q4_groups(r) + q4_groups(dr);
    TORCH_CHECK(latent.scalar_type() == at::kByte && rope.scalar_type() == at::kByte && latent.size(-1) == q4_bytes(r) &&
                    rope.size(-1) == q4_bytes(dr) && scale.size(-1) == groups,
                "mla_decode: a q4_0 cache is uint8 latent [.., (r+1)/2], uint8 rope [.., (dr+1)/2] and float16 scale "
                "[.., groups of 32]");
    job.kind = KIND_Q4;
    job.scale_stride = (int)groups;
    job.latent = latent.data_ptr();
    job.rope = rope.data_ptr();
    job.scale16 = (const uint16_t*)scale.data_ptr();
  } else {
    TORCH_CHECK(latent.is_contiguous() && scale.is_contiguous() && rope.is_contiguous(),
                "mla_decode: latent, scale and rope must be contiguous");
    TORCH_CHECK(latent.size(-1) == r && rope.size(-1) == D - r, "mla_decode: latent/rope widths do not match D");
    TORCH_CHECK(latent.scalar_type() == at::kChar || latent.scalar_type() == at::kByte,
                "mla_decode: latent must be int8 or uint8 (fp8 e4m3 bits)");
    TORCH_CHECK(rope.scalar_type() == at::kFloat || rope.scalar_type() == at::kBFloat16 || rope.scalar_type() == at::kChar,
                "mla_decode: rope must be float32, bfloat16 or int8");
    job.rope_i8 = rope.scalar_type() == at::kChar;
    job.scale_stride = job.rope_i8 ? 2 : 1;
    TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == latent.numel() / r * job.scale_stride,
                "mla_decode: scale must be float32, one per token (two with an int8 rope: latent's, rope's)");
    job.kind = latent.scalar_type() == at::kChar ? KIND_I8 : KIND_FP8;
    job.latent = latent.data_ptr();
    job.scale = scale.data_ptr<float>();
    job.rope = rope.data_ptr();
    job.rope_bf16 = rope.scalar_type() == at::kBFloat16;
  }

  // Visible keys per row: query_pos + 1 (causal), else the whole context.
  const int64_t* ctx = context_lens.data_ptr<int64_t>();
  std::vector<int64_t> lim(B * M);
  bool causal = query_pos.numel() > 0;
  if (causal) query_pos = query_pos.contiguous();
  const int64_t Q = M / heads;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m) {
      int64_t l = causal ? query_pos.data_ptr<int64_t>()[b * Q + m / heads] + 1 : ctx[b];
      lim[b * M + m] = l < ctx[b] ? l : ctx[b];
    }

  // Work items: spans of a length that depends only on the sequence's own context (never on the
  // batch or the threads), so each sequence's reduction order is fixed.
  std::vector<int64_t> item_b, item_t0, item_t1, first(B + 1);
  for (int64_t b = 0; b < B; ++b) {
    first[b] = (int64_t)item_b.size();
    int64_t len = ctx[b];
    TORCH_CHECK(len >= 1 && (len + block_size - 1) / block_size <= job.nb, "mla_decode: sequence ", b,
                " has context ", len, " beyond its block table");
    int64_t span = (len + MAX_SPANS - 1) / MAX_SPANS;
    span = span < SPAN ? SPAN : (span + TILE - 1) / TILE * TILE;
    for (int64_t t0 = 0; t0 < len; t0 += span) {
      item_b.push_back(b);
      item_t0.push_back(t0);
      item_t1.push_back(t0 + span < len ? t0 + span : len);
    }
  }
  first[B] = (int64_t)item_b.size();
  const int64_t items = first[B];
  // Each item sets its own (max, sum, acc) before use: acc is not zeroed here (at 8K, 571 KB per
  // layer and step that one thread cleared before the parallel region).
  std::unique_ptr<float[]> acc(new float[items * M * r]);
  std::vector<float> mx(items * M), sum(items * M);

  // bf16 queries on an avx512_bf16 CPU: bf16 dot products straight from the query; otherwise
  // the query rows of each sequence widened once to float32.
  // (r % 32 == 16, the default conversion's 240: the latent ends mid-chunk, in a full chunk)
  // (q4_0 rows are widened to float32 by load_row on every ISA: the bf16 loops widen their own kinds)
  const bool dp_bf16 = has(caps, NEEDS_AVX512_BF16) && job.kind != KIND_Q4 && query.scalar_type() == at::kBFloat16 && (r % 32 == 0 || (r % 16 == 0 && D / 32 > r / 32));
  std::vector<float> qf(dp_bf16 ? 0 : B * M * D);
  if (dp_bf16) {
  } else if (query.scalar_type() == at::kFloat) {
    std::memcpy(qf.data(), query.data_ptr<float>(), sizeof(float) * B * M * D);
  } else {
    const uint16_t* qs = (const uint16_t*)query.data_ptr();
    for (int64_t i = 0; i < B * M * D; ++i) qf[i] = bf16_to_f32(qs[i]);
  }
  const uint16_t* q16 = dp_bf16 ? (const uint16_t*)query.data_ptr() : nullptr;
  // An int8 latent with a bf16 rope on that path: integer dot products, the query's latent part in int8.
  const bool dp_i8 = dp_bf16 && job.kind == KIND_I8 && job.rope_bf16 && r % 64 == 0;
  std::vector<int8_t> q8(dp_i8 ? B * M * 2 * r : 0);
  std::vector<float> qs(dp_i8 ? B * M : 0);
  std::vector<int32_t> qsum(dp_i8 ? B * M * 2 : 0);
  if (dp_i8) isa_avx512bf16::quantize_rows(q16, B * M, (int)D, (int)r, q8.data(), qs.data(), qsum.data());

  // AMX (amx_bf16): the bf16 path's scores and value sums on tiles (mla_decode_amx.h); the int8 VNNI path stays.
  // An int8 latent and rope whose widths are whole int8 tile steps (amx_int8): integer tile products
  // (mla_decode_amx_i8.h).
  const bool dp_amx_i8 = has(caps, NEEDS_AMX_INT8) && dp_bf16 && !dp_i8 && job.kind == KIND_I8 && job.rope_i8 &&
                         r % 64 == 0 && (D - r) % 64 == 0 && D - r > 0;
  const bool dp_amx = has(caps, NEEDS_AMX_BF16) && dp_bf16 && !dp_i8 && !dp_amx_i8 && D % 2 == 0 && D >= 32;
  const bool split = job.kind == KIND_I8 || job.kind == KIND_FP8;
  const int64_t qblocks = dp_amx_i8 ? (M + 15) / 16 * isa_avx512bf16::amx_i8_query_block((int)D)
                                    : (M + 15) / 16 * (split ? 2 : 1) * isa_avx512bf16::amx_query_block((int)D);
  // not zeroed: pack_queries writes every step the kernel reads (786 KB a layer at 32 sequences)
  std::unique_ptr<uint32_t[]> qpack(new uint32_t[dp_amx || dp_amx_i8 ? B * qblocks : 0]);
  std::vector<float> qscale(dp_amx_i8 ? B * M * 2 : 0);
  const int pack_threads = (int)std::min<int64_t>(threads, B);
  if (dp_amx) isa_avx512bf16::pack_queries(q16, B, (int)M, (int)D, (int)r, split, qpack.get(), pack_threads);
  if (dp_amx_i8) isa_avx512bf16::pack_queries_i8(q16, B, (int)M, (int)D, (int)r, qpack.get(), qscale.data(), pack_threads);
  SpanFn attend = span_fn(caps);
  // No more threads than work: an idle member of a team still costs a fork and a join per region
  // (two regions per layer and step), and the merge of a short batch is a few thousand FMAs.
  const int nthreads = (int)std::max<int64_t>(1, std::min<int64_t>(threads, items));
  const int merge_threads = B * M * items * r >= (1 << 16) ? nthreads : 1;
  const int64_t Dp = (D + 31) / 32 * 32;
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<float> tile(TILE * D), sc(TILE + 64 + r);
    std::vector<uint16_t> tile16, pairs16, zero16;
    if (dp_bf16) tile16.resize(64 * Dp), pairs16.resize(64 * r), zero16.assign(Dp, 0);
    std::unique_ptr<isa_avx512bf16::AmxDecodeScratch> amx;
    if (dp_amx || dp_amx_i8) {
      amx.reset(new isa_avx512bf16::AmxDecodeScratch((int)D, (int)r));
      isa_avx512bf16::amx_configure();
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      int64_t b = item_b[it];
      if (dp_amx_i8)
        isa_avx512bf16::attend_span_amx_i8(job, b, item_t0[it], item_t1[it], qpack.get() + b * qblocks,
                                           qscale.data() + b * M * 2, lim.data() + b * M, acc.get() + it * M * r,
                                           mx.data() + it * M, sum.data() + it * M,
                                           {tile16.data(), pairs16.data(), zero16.data()}, *amx);
      else if (dp_amx)
        isa_avx512bf16::attend_span_amx(job, b, item_t0[it], item_t1[it], qpack.get() + b * qblocks, lim.data() + b * M,
                                        acc.get() + it * M * r, mx.data() + it * M, sum.data() + it * M,
                                        {tile16.data(), pairs16.data(), zero16.data()}, *amx);
      else if (dp_i8)
        isa_avx512bf16::attend_span_i8(job, b, item_t0[it], item_t1[it], q16 + b * M * D, q8.data() + b * M * 2 * r,
                                       qs.data() + b * M, qsum.data() + b * M * 2, lim.data() + b * M,
                                       acc.get() + it * M * r, mx.data() + it * M, sum.data() + it * M,
                                       {tile16.data(), pairs16.data(), zero16.data()}, sc.data());
      else if (dp_bf16)
        isa_avx512bf16::attend_span_bf16(job, b, item_t0[it], item_t1[it], q16 + b * M * D, lim.data() + b * M,
                                         acc.get() + it * M * r, mx.data() + it * M, sum.data() + it * M,
                                         {tile16.data(), pairs16.data(), zero16.data()});
      else
        attend(job, b, item_t0[it], item_t1[it], qf.data() + b * M * D, lim.data() + b * M, acc.get() + it * M * r,
               mx.data() + it * M, sum.data() + it * M, tile.data(), sc.data());
    }
    if (dp_amx || dp_amx_i8) isa_avx512bf16::amx_decode_release();
  }

  // Log-sum-exp merge of each sequence's spans, in span order.
  auto out = at::empty({B, M, r}, query.options());
  const bool bf16 = query.scalar_type() == at::kBFloat16;
  float* out32 = bf16 ? nullptr : out.data_ptr<float>();
  uint16_t* out16 = bf16 ? (uint16_t*)out.data_ptr() : nullptr;
  MergeFn merge = merge_fn(caps);
#pragma omp parallel num_threads(merge_threads)
  {
    std::vector<float> row(r);
#pragma omp for schedule(static)
    for (int64_t bm = 0; bm < B * M; ++bm) {
      const int64_t b = bm / M, m = bm % M, it0 = first[b];
      merge(acc.get() + (it0 * M + m) * r, mx.data() + it0 * M + m, sum.data() + it0 * M + m, first[b + 1] - it0, M,
            (int)r, row.data(), bf16 ? nullptr : out32 + bm * r, bf16 ? out16 + bm * r : nullptr);
    }
  }
  return out;
}

// The float32 kernel (mla_prefill_f32.h) at one ISA's vector width, on tensors of element type T.
template <typename Job, typename T>
void prefill_f32(Job job, const at::Tensor& q, const at::Tensor& kv, const at::Tensor& k_r, int64_t dn, int64_t first,
                 int64_t key_start, at::Tensor& m, at::Tensor& l, at::Tensor& acc, double scale, int nthreads,
                 void (*run)(Job&, int)) {
  const int64_t n = q.size(0), H = q.size(1), dr = k_r.size(-1), S = kv.size(0), dv = kv.size(2) - dn;
  job.n = (int)n, job.H = (int)H, job.dn = (int)dn, job.dr = (int)dr, job.dv = (int)dv, job.dvp = (int)acc.size(2);
  const int64_t groups = k_r.dim() == 3 ? k_r.size(1) : 1;
  job.krs = (int)(groups * dr), job.hpg = (int)(H / groups);
  job.kvh = (int)kv.size(1), job.hpk = (int)(H / kv.size(1));
  job.D = (int)(dn + dr), job.S = (int)S, job.nkb = (int)(S / isa_avx2::F32_KB);
  job.first = first, job.key_start = key_start, job.scale = (float)scale;
  job.q = (const T*)q.data_ptr(), job.kv = (const T*)kv.data_ptr(), job.kr = (const T*)k_r.data_ptr();
  std::vector<float> kp((size_t)H * S * job.D), vp((size_t)H * S * job.dvp);
  job.kp = kp.data(), job.vp = vp.data();
  job.m = m.data_ptr<float>(), job.l = l.data_ptr<float>(), job.acc = acc.data_ptr<float>();
  run(job, nthreads);
}

template <typename T>
void prefill_f32_isa(int64_t caps, const at::Tensor& q, const at::Tensor& kv, const at::Tensor& k_r, int64_t dn,
                     int64_t first, int64_t key_start, at::Tensor& m, at::Tensor& l, at::Tensor& acc, double scale,
                     int nthreads) {
  if (has(caps, NEEDS_AVX512))
    prefill_f32<isa_avx512::F32PrefillJob<T>, T>({}, q, kv, k_r, dn, first, key_start, m, l, acc, scale, nthreads,
                                                     isa_avx512::f32_prefill_run<16, T>);
  else if (has(caps, NEEDS_AVX2))
    prefill_f32<isa_avx2::F32PrefillJob<T>, T>({}, q, kv, k_r, dn, first, key_start, m, l, acc, scale, nthreads,
                                                  isa_avx2::f32_prefill_run<8, T>);
  else
    prefill_f32<isa_scalar::F32PrefillJob<T>, T>({}, q, kv, k_r, dn, first, key_start, m, l, acc, scale, nthreads,
                                                    isa_scalar::f32_prefill_run<4, T>);
}

// One prefill span (mla_prefill_bf16.h / mla_prefill_f32.h have the shapes); updates m, l, acc in
// place. bf16 tensors on avx512_bf16 (dr even): vdpbf16ps, on amx_bf16: tiles; everything else: the float32 kernel at
// the path's width (bf16 tensors widened when packed).
void mla_prefill(at::Tensor q, at::Tensor kv, at::Tensor k_r, int64_t dn, int64_t first, int64_t key_start,
                 at::Tensor m, at::Tensor l, at::Tensor acc, double scale, int64_t caps, int64_t threads) {
  check_caps(caps, "mla_prefill");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "mla_prefill: q must be float32 or bf16");
  for (const at::Tensor* t : {&q, &kv, &k_r})
    TORCH_CHECK(t->scalar_type() == dtype && t->is_contiguous(), "mla_prefill: q, kv, k_r must be contiguous, one dtype");
  for (const at::Tensor* t : {&m, &l, &acc})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "mla_prefill: m, l, acc must be contiguous float32");
  const int64_t n = q.size(0), H = q.size(1), dr = k_r.size(-1), S = kv.size(0), dv = kv.size(2) - dn, dvp = acc.size(2);
  const int64_t groups = k_r.dim() == 3 ? k_r.size(1) : 1;  // rope keys: one for all heads, or one per group of heads
  TORCH_CHECK(q.dim() == 3 && q.size(2) == dn + dr && kv.dim() == 3 && kv.size(1) > 0 && H % kv.size(1) == 0 && dvp >= dv && dvp < dv + 16 &&
                  (k_r.dim() == 2 || k_r.dim() == 3) && k_r.size(0) == S && groups > 0 && H % groups == 0 &&
                  m.numel() == n * H && l.numel() == n * H && acc.size(0) == n && acc.size(1) == H,
              "mla_prefill: shapes do not match");
  static_assert(isa_avx512bf16::KB == isa_avx2::F32_KB, "both prefill kernels use the same key blocks");
  TORCH_CHECK(S % isa_avx2::F32_KB == 0 && key_start % isa_avx2::F32_KB == 0 && dvp % 16 == 0,
              "mla_prefill: the span and key_start must be multiples of the key block (64), acc's width dv padded "
              "to a multiple of 16");
  const int nthreads = threads > 0 ? (int)threads : 1;
  const bool bf16_job = dtype == at::kBFloat16 && has(caps, NEEDS_AVX512_BF16) && dr % 2 == 0;  // else the float32 kernel
  const bool amx = bf16_job && has(caps, NEEDS_AMX_BF16);
  // The first span (keys from 0) starts every row's state afresh: m, l, acc are not read (the
  // caller need not fill them); the AMX path sets it as it loads a row, the others are filled here.
  if (key_start == 0 && !amx) {
    m.fill_(-std::numeric_limits<float>::infinity());
    l.zero_();
    acc.zero_();
  }
  if (dtype == at::kFloat)
    return prefill_f32_isa<float>(caps, q, kv, k_r, dn, first, key_start, m, l, acc, scale, nthreads);
  if (!bf16_job)
    return prefill_f32_isa<uint16_t>(caps, q, kv, k_r, dn, first, key_start, m, l, acc, scale, nthreads);
  isa_avx512bf16::PrefillJob job;
  job.n = (int)n, job.H = (int)H, job.dn = (int)dn, job.dr = (int)dr, job.dv = (int)dv, job.dvp = (int)dvp, job.S = (int)S;
  job.pn = (int)(dn + 1) / 2, job.P = job.pn + (int)dr / 2, job.nkb = (int)(S / isa_avx512bf16::KB);
  job.krs = (int)(groups * dr), job.hpg = (int)(H / groups);
  job.kvh = (int)kv.size(1), job.hpk = (int)(H / kv.size(1));
  if (amx) isa_avx512bf16::amx_layout(job);  // whole tiles of pairs: keys read in place or packed
  job.first = first, job.key_start = key_start, job.scale = (float)scale;
  job.q = (const uint16_t*)q.data_ptr(), job.kv = (const uint16_t*)kv.data_ptr(), job.kr = (const uint16_t*)k_r.data_ptr();
  // kept between calls (every span of every layer): fresh ones were zero-filled and page-faulted
  // in each time, ~20% of an 8K prefill in the kernel's page clearing
  thread_local std::vector<uint16_t> kp, vp;
  if (!job.keys_in_place && kp.size() < (size_t)H * S * job.P * 2) kp.resize((size_t)H * S * job.P * 2);
  if (vp.size() < (size_t)H * S * dvp) vp.resize((size_t)H * S * dvp);
  job.kp = kp.data(), job.vp = vp.data();
  job.m = m.data_ptr<float>(), job.l = l.data_ptr<float>(), job.acc = acc.data_ptr<float>();
  if (amx) isa_avx512bf16::prefill_run_amx(job, nthreads);
  else isa_avx512bf16::prefill_run(job, nthreads);
}

// The prefill's last step after its spans: out [n, H, dv] = acc [n, H, :dv] / l [n, H], in out's
// dtype (bf16 rounded to nearest even, a NaN to its quiet NaN: torch's (acc / l).to(dtype)), in one
// pass into out (a contiguous view: the step's rows of the layer's output).
void prefill_finish(at::Tensor acc, at::Tensor l, at::Tensor out) {
  TORCH_CHECK(acc.scalar_type() == at::kFloat && l.scalar_type() == at::kFloat && acc.is_contiguous() && l.is_contiguous() &&
                  out.is_contiguous() && (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "prefill_finish: acc, l float32 and out float32 or bf16, all contiguous");
  TORCH_CHECK(acc.dim() == 3 && out.dim() == 3 && out.size(0) == acc.size(0) && out.size(1) == acc.size(1) &&
                  out.size(2) <= acc.size(2) && l.numel() == acc.size(0) * acc.size(1),
              "prefill_finish: acc [n, H, dvp], l [n, H], out [n, H, dv <= dvp]");
  const int64_t rows = acc.size(0) * acc.size(1), dvp = acc.size(2), dv = out.size(2);
  const float *ap = acc.data_ptr<float>(), *lp = l.data_ptr<float>();
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  void* op = out.data_ptr();
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* a = ap + r * dvp;
      const float s = lp[r];
      if (bf16) {
        uint16_t* o = (uint16_t*)op + r * dv;
#pragma omp simd
        for (int64_t d = 0; d < dv; ++d) o[d] = f32_to_bf16(a[d] / s);
      } else {
        float* o = (float*)op + r * dv;
#pragma omp simd
        for (int64_t d = 0; d < dv; ++d) o[d] = a[d] / s;
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL released while the kernels run: the server's event loop and tokenizer thread go on beside them
  m.def("mla_prefill", &mla_prefill, py::call_guard<py::gil_scoped_release>(), "one span of the batch-invariant MLA prefill (see mla_prefill_f32.h)");
  m.def("prefill_finish", &prefill_finish, py::call_guard<py::gil_scoped_release>(), "out = acc[..., :dv] / l in out's dtype (the prefill's last step)");
  m.def("mla_decode", &mla_decode, py::call_guard<py::gil_scoped_release>(), "paged MLA decode attention (see mla_attention.cpp)");
  // for the decode plan (decode_ops/decode_step.cpp), which calls the kernel without Python between
  m.attr("mla_decode_capsule") = export_fn<DecodeFn>(&mla_decode);  // of the type kernel_fns.h declares
  def_isa_paths(m, PATHS);
}
