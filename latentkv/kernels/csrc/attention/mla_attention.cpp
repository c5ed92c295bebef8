// latentkv native CPU attention: paged MLA decode (absorbed MQA over the latent cache), and the
// batch-invariant prefill kernel (naive form: float32 FMAs at each ISA's width, mla_prefill_f32.h;
// bf16 dot products on avx512_bf16, mla_prefill_bf16.h; bf16 tiles on amx_bf16, mla_prefill_amx.h).
// This unit holds the entries: their argument checks, the choice of loops from the capabilities that
// serve, the decode's work items and merge. Each path's loops are a unit of their own under its target
// (attention_<isa>.cpp), reached through mla_paths.h.
// Python side: latentkv/kernels/attention.py (build, ISA choice, self-check, fallback: kernels/build.py). Shapes:
//   query [B, M, D] (M = Q*H absorbed query rows, D = kv_rank + rope_dim; bf16 or float32)
//   cache: as cache_kinds.h's entry `cache_kind` lays it out: kv [blocks, bs, D] (bf16/float32), or
//          latent [blocks, bs, r] int8|uint8(fp8 e4m3) + scale [blocks, bs] float32 ([.., 2] with an int8
//          rope) + rope [blocks, bs, D - r] (bf16 or int8), or q4_0 blocks: uint8 latent [blocks, bs,
//          (r+1)/2] + uint8 rope [.., (D-r+1)/2] + float16 scale [.., groups]
//   block_tables [B, nb] int64, context_lens [B] int64, query_pos [B, Q] int64 (or empty:
//   every row sees the whole context) -> out [B, M, r] in the query dtype.
#include "cache_kinds.h"
#include "kernel_fns.h"
#include "torch_lite.h"

#include "bf16.h"
#include "isa_paths.h"
#include "mla_job.h"
#include "mla_paths.h"
#include "tc_chunks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

constexpr IsaPath PATHS[] = {{"avx2", NEEDS_AVX2},
                             {"avx512", NEEDS_AVX512},
                             {"avx512_bf16", NEEDS_AVX512_BF16},
                             {"amx_bf16", NEEDS_AMX_BF16},
                             {"amx_int8", NEEDS_AMX_INT8}};

namespace {

// The float32 loops the capabilities allow: avx512_bf16's decode and merge are the avx512 loops
// compiled for its target, its prefill avx512's.
FloatPath float_loops(int64_t caps) {
  if (has(caps, NEEDS_AVX512_BF16)) {
    const FloatPath own = isa_avx512bf16::float_path();
    return {own.decode, own.merge, isa_avx512::float_path().prefill};
  }
  if (has(caps, NEEDS_AVX512)) return isa_avx512::float_path();
  if (has(caps, NEEDS_AVX2)) return isa_avx2::float_path();
  return isa_scalar::float_path();
}

struct DecodeLoops {
  DecodeRun run;
  bool f32_queries;  // the loops read float32 query rows (bf16 ones widened once by the entry)
};

// Which loops run a decode, from the capabilities, the cache and the shapes. bf16 queries on an
// avx512_bf16 CPU: bf16 dot products straight from the query (r % 32 == 16, the default
// conversion's 240: the latent ends mid-chunk, in a full chunk; q4_0 rows are widened to float32 by
// load_row on every ISA: the bf16 loops widen their own kinds); an int8 latent with a bf16 rope key
// there: integer dot products, the query's latent part in int8 (not on AMX CPUs: their bf16 tiles over
// the latent widened a tile ahead ran V3's shape 1.2-1.4x faster, the bundled model's 1.05-1.15x, in
// `bench kernel --latents int8`, one thread); on amx_int8, an int8
// latent and rope key whose widths are whole int8 tile steps: integer tile products; on amx_bf16,
// the bf16 path's scores and value sums on tiles. Everything else: the float32 loops of the path.
DecodeLoops decode_loops(int64_t caps, const CacheKind& kind, bool bf16_query, int64_t D, int64_t r) {
  const bool dot = has(caps, NEEDS_AVX512_BF16) && kind.latent != KIND_Q4 && bf16_query &&
                   (r % 32 == 0 || (r % 16 == 0 && D / 32 > r / 32));
  if (!dot) return {float_loops(caps).decode, true};
  if (kind.latent == KIND_I8 && kind.rope == ROPE_BF16 && r % 64 == 0 && !has(caps, NEEDS_AMX_BF16)) return {isa_avx512bf16::dot_path().decode_i8, false};
  if (has(caps, NEEDS_AMX_INT8) && kind.latent == KIND_I8 && kind.rope == ROPE_I8 && r % 64 == 0 && (D - r) % 64 == 0 &&
      D - r > 0)
    return {isa_amx_int8::decode_path(), false};
  if (has(caps, NEEDS_AMX_BF16) && D % 2 == 0 && D >= 32) return {isa_amx_bf16::tile_path().decode, false};
  return {isa_avx512bf16::dot_path().decode_bf16, false};
}

struct PrefillLoops {
  PrefillRun run;
  bool starts_state;  // a first span (key_start 0) sets m, l, acc itself as it loads a row
};

// Which loops run a prefill span: bf16 tensors on avx512_bf16 (dr even) bf16 dot products, on amx_bf16
// tiles; everything else the float32 kernel at the path's width (bf16 tensors widened as packed).
PrefillLoops prefill_loops(int64_t caps, bool bf16, int64_t dr) {
  const bool dot = bf16 && has(caps, NEEDS_AVX512_BF16) && dr % 2 == 0;
  if (dot && has(caps, NEEDS_AMX_BF16)) return {isa_amx_bf16::tile_path().prefill, true};
  if (dot) return {isa_avx512bf16::dot_path().prefill, false};
  return {float_loops(caps).prefill, false};
}

// The cache's tensors checked against its kind (a clear error where they disagree) and set in the job.
void cache_job(const CacheKind& kind, const at::Tensor& kv, const at::Tensor& latent, const at::Tensor& scale,
               const at::Tensor& rope, int64_t D, int64_t r, Job& job) {
  const char* names[] = {"kv", "latent", "scale", "rope"};
  const at::Tensor* parts[] = {&kv, &latent, &scale, &rope};
  for (int i = 0; i < 4; ++i) {
    const at::ScalarType want = kind.dtypes[i];
    if (want == at::ScalarType::Undefined) {
      TORCH_CHECK(parts[i]->numel() == 0, "mla_decode: the cache kind ", kind.name, " has no ", names[i], " tensor (got one of ",
                  parts[i]->sizes(), ")");
      continue;
    }
    TORCH_CHECK(parts[i]->scalar_type() == want && parts[i]->is_contiguous(), "mla_decode: the cache kind ",
                kind.name, " holds ", names[i], " as contiguous ", at::toString(want), " (got ",
                at::toString(parts[i]->scalar_type()), " of ", parts[i]->sizes(), ")");
  }
  job.kind = kind.latent;
  job.rope_bf16 = kind.rope == ROPE_BF16;
  job.rope_i8 = kind.rope == ROPE_I8;
  const int64_t dr = D - r;
  if (kind.rope == ROPE_IN_ROW) {
    TORCH_CHECK(kv.size(-1) == D, "mla_decode: the cache kind ", kind.name, " is kv [blocks, bs, ", D, "]");
    job.kv = kv.data_ptr();
    return;
  }
  if (kind.latent == KIND_Q4) {  // latentkv/cache/q4.py
    job.scale_stride = (int)(q4_groups(r) + q4_groups(dr));
    TORCH_CHECK(latent.size(-1) == q4_bytes(r) && rope.size(-1) == q4_bytes(dr) && scale.size(-1) == job.scale_stride,
                "mla_decode: a q4_0 cache is latent [.., (r+1)/2], rope [.., (dr+1)/2] and scale [.., groups of 32]");
    job.scale16 = (const uint16_t*)scale.data_ptr();
  } else {
    job.scale_stride = job.rope_i8 ? 2 : 1;
    TORCH_CHECK(latent.size(-1) == r && rope.size(-1) == dr, "mla_decode: latent/rope widths do not match D");
    TORCH_CHECK(scale.numel() == latent.numel() / r * job.scale_stride, "mla_decode: the cache kind ", kind.name,
                " has ", job.scale_stride, " scale(s) per token");
    job.scale = scale.data_ptr<float>();
  }
  job.latent = latent.data_ptr();
  job.rope = rope.data_ptr();
}

// The checks every decode entry makes of the query and the tables; query rows made contiguous.
void check_decode_args(at::Tensor& query, at::Tensor& block_tables, at::Tensor& context_lens, int64_t heads) {
  TORCH_CHECK(query.dim() == 3, "mla_decode: query must be [B, M, D]");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "mla_decode: query must be float32 or bfloat16");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "mla_decode: block_tables and context_lens must be int64");
  query = query.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  TORCH_CHECK(query.size(1) % heads == 0, "mla_decode: query rows must be a multiple of the heads");
}

// A decode whose job holds its cache (kind, tensors, r, block size): the work items, the loops the
// capabilities pick, and the merge -> out [B, M, r] in the query dtype.
at::Tensor run_decode(const at::Tensor& query, Job& job, const CacheKind& kind, const at::Tensor& block_tables,
                      const at::Tensor& context_lens, at::Tensor query_pos, int64_t heads, int64_t caps,
                      int64_t threads) {
  const int64_t B = query.size(0), M = query.size(1), D = query.size(2), r = job.r;
  const int64_t block_size = job.bs;
  job.M = (int)M, job.D = (int)D;
  job.nb = block_tables.size(1);
  job.block_tables = block_tables.data_ptr<int64_t>();

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

  const bool bf16 = query.scalar_type() == at::kBFloat16;
  const DecodeLoops loops = decode_loops(caps, kind, bf16, D, r);
  // float32 loops: the query rows of each sequence widened once to float32
  std::vector<float> qf(loops.f32_queries ? B * M * D : 0);
  const uint16_t* q16 = bf16 ? (const uint16_t*)query.data_ptr() : nullptr;
  if (loops.f32_queries && !bf16) std::memcpy(qf.data(), query.data_ptr<float>(), sizeof(float) * B * M * D);
  if (loops.f32_queries && bf16)
    for (int64_t i = 0; i < B * M * D; ++i) qf[i] = bf16_to_f32(q16[i]);
  // No more threads than work: an idle member of a team still costs a fork and a join per region
  // (two regions per layer and step), and the merge of a short batch is a few thousand FMAs.
  const int nthreads = (int)std::max<int64_t>(1, std::min<int64_t>(threads, items));
  const int merge_threads = B * M * items * r >= (1 << 16) ? nthreads : 1;
  DecodeWork work{};
  work.job = &job, work.B = B, work.M = M, work.D = D, work.r = r, work.items = items;
  work.item_b = item_b.data(), work.item_t0 = item_t0.data(), work.item_t1 = item_t1.data(), work.lim = lim.data();
  work.acc = acc.get(), work.mx = mx.data(), work.sum = sum.data(), work.qf = qf.data(), work.q16 = q16;
  work.threads = nthreads, work.pack_threads = (int)std::min<int64_t>(threads, B);
  loops.run(work);

  // Log-sum-exp merge of each sequence's spans, in span order.
  auto out = at::empty({B, M, r}, query.options());
  float* out32 = bf16 ? nullptr : out.data_ptr<float>();
  uint16_t* out16 = bf16 ? (uint16_t*)out.data_ptr() : nullptr;
  const MergeRow merge = float_loops(caps).merge;
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

}  // namespace

at::Tensor mla_decode(at::Tensor query, at::Tensor kv, at::Tensor latent, at::Tensor scale, at::Tensor rope,
                      int64_t cache_kind, at::Tensor block_tables, at::Tensor context_lens, at::Tensor query_pos,
                      int64_t heads, int64_t kv_rank, int64_t block_size, int64_t caps, int64_t threads) {
  check_caps(caps, "mla_decode");
  TORCH_CHECK(cache_kind >= 0 && cache_kind < CACHE_KIND_COUNT, "mla_decode: cache kind ", cache_kind,
              " is none of the kernel's (0 to ", CACHE_KIND_COUNT - 1, ": cache_kinds())");
  const CacheKind& kind = CACHE_KINDS[cache_kind];
  check_decode_args(query, block_tables, context_lens, heads);
  Job job{};
  job.r = (int)kv_rank, job.bs = (int)block_size;
  cache_job(kind, kv, latent, scale, rope, query.size(2), kv_rank, job);
  return run_decode(query, job, kind, block_tables, context_lens, query_pos, heads, caps, threads);
}

// A transform-coded layer (cache/coded.py; TcLayout in mla_job.h): query [B, M, values + cs_width]
// (turned into the code's groups, its rope key's mean as weights of cos and sin: attention/coded.py),
// codes uint8 [blocks, bs, code_bytes], scales float16 [blocks, bs, groups], runs int32 [n, TC_RUN],
// steps float32 [n, 2], cs float32 [positions, cs_width] -> out [B, M, latent values] in the packed,
// turned basis (the caller turns it back).
at::Tensor mla_decode_coded(at::Tensor query, at::Tensor codes, at::Tensor scales, at::Tensor runs, at::Tensor steps,
                            at::Tensor cs, int64_t latent_values, at::Tensor block_tables, at::Tensor context_lens,
                            at::Tensor query_pos, int64_t heads, int64_t block_size, int64_t caps, int64_t threads) {
  check_caps(caps, "mla_decode_coded");
  check_decode_args(query, block_tables, context_lens, heads);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 && codes.size(1) == block_size,
              "mla_decode_coded: codes must be contiguous uint8 [blocks, block_size, code_bytes]");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 3 &&
                  scales.size(0) == codes.size(0) && scales.size(1) == block_size,
              "mla_decode_coded: scales must be contiguous float16 [blocks, block_size, groups]");
  TORCH_CHECK(runs.scalar_type() == at::kInt && runs.is_contiguous() && runs.dim() == 2 && runs.size(1) == TC_RUN &&
                  steps.scalar_type() == at::kFloat && steps.is_contiguous() && steps.numel() == 2 * runs.size(0),
              "mla_decode_coded: runs int32 [n, ", TC_RUN, "] and steps float32 [n, 2]");
  TORCH_CHECK(cs.scalar_type() == at::kFloat && cs.is_contiguous() && cs.dim() == 2, "mla_decode_coded: cs float32 [positions, width]");
  Job job{};
  job.kind = KIND_TC;
  job.r = (int)latent_values, job.bs = (int)block_size;
  job.latent = codes.data_ptr();
  job.scale16 = (const uint16_t*)scales.data_ptr();
  TcLayout& tc = job.tc;
  tc.runs = runs.data_ptr<int32_t>(), tc.steps = steps.data_ptr<float>(), tc.n_runs = (int)runs.size(0);
  tc.code_bytes = (int)codes.size(2), tc.groups = (int)scales.size(2);
  TORCH_CHECK(tc.groups <= TC_MAX_GROUPS, "mla_decode_coded: ", tc.groups, " scale groups a token, the kernel's most ", TC_MAX_GROUPS);
  tc.cs = cs.data_ptr<float>(), tc.cs_width = (int)cs.size(1), tc.cs_rows = cs.size(0);
  tc.values = (int)(query.size(2) - tc.cs_width);
  TORCH_CHECK(0 < latent_values && latent_values <= tc.values, "mla_decode_coded: ", latent_values,
              " latent values of a row of ", tc.values);
  const int32_t* rp = tc.runs;
  tc.inner = 0;
  for (int k = 0; k < tc.n_runs; ++k, rp += TC_RUN) {  // every run's load, bits and columns inside the row
    TORCH_CHECK(rp[0] >= 0 && rp[0] < tc.code_bytes && rp[1] >= 0 && rp[1] < 8 && rp[2] >= 1 && rp[2] <= 8 &&
                    rp[3] >= 1 && rp[3] <= 16 && rp[1] + rp[2] * rp[3] <= 8 * std::min(16, tc.code_bytes - rp[0]) &&
                    rp[4] >= 0 && rp[4] + rp[3] <= tc.values && rp[5] >= 0 && rp[5] < tc.groups &&
                    (k == 0 || rp[0] >= rp[-TC_RUN]),
                "mla_decode_coded: run ", k, " lies outside the token's codes, scales or row, or before run ", k - 1);
    if (rp[0] + 24 <= tc.code_bytes) tc.inner = k + 1;  // (in byte order: the first ones)
  }
  const int64_t* ctx = context_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < context_lens.numel(); ++b)
    TORCH_CHECK(ctx[b] <= tc.cs_rows, "mla_decode_coded: a context of ", ctx[b], " beyond cs's ", tc.cs_rows, " positions");
  std::vector<TcChunk> chunks;
  std::vector<float> group_step(TC_CHUNK_GROUPS, 0.0f);
  tc_chunks(tc, chunks, group_step.data());
  tc.chunks = chunks.data(), tc.n_chunks = (int)chunks.size(), tc.group_step = group_step.data();
  static constexpr CacheKind CODED{"transform_code", KIND_TC, ROPE_IN_ROW, {}};
  return run_decode(query, job, CODED, block_tables, context_lens, query_pos, heads, caps, threads);
}

// One prefill span (mla_prefill_bf16.h / mla_prefill_f32.h have the shapes); updates m, l, acc in
// place, through the loops prefill_loops picks.
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
  TORCH_CHECK(S % PREFILL_KB == 0 && key_start % PREFILL_KB == 0 && dvp % 16 == 0,
              "mla_prefill: the span and key_start must be multiples of the key block (64), acc's width dv padded "
              "to a multiple of 16");
  const PrefillLoops loops = prefill_loops(caps, dtype == at::kBFloat16, dr);
  // The first span (keys from 0) starts every row's state afresh: m, l, acc are not read (the
  // caller need not fill them); the AMX path sets it as it loads a row, the others are filled here.
  if (key_start == 0 && !loops.starts_state) {
    m.fill_(-std::numeric_limits<float>::infinity());
    l.zero_();
    acc.zero_();
  }
  PrefillSpan span{};
  span.n = n, span.H = H, span.dn = dn, span.dr = dr, span.dv = dv, span.dvp = dvp, span.S = S;
  span.groups = groups, span.kvh = kv.size(1), span.first = first, span.key_start = key_start;
  span.scale = (float)scale, span.bf16 = dtype == at::kBFloat16;
  span.q = q.data_ptr(), span.kv = kv.data_ptr(), span.kr = k_r.data_ptr();
  span.m = m.data_ptr<float>(), span.l = l.data_ptr<float>(), span.acc = acc.data_ptr<float>();
  span.threads = threads > 0 ? (int)threads : 1;
  loops.run(span);
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
  m.def("mla_decode_coded", &mla_decode_coded, py::call_guard<py::gil_scoped_release>(),
        "paged MLA decode over a transform-coded layer (see mla_attention.cpp)");
  // for the decode plan (decode_ops/decode_step.cpp), which calls the kernel without Python between
  m.attr("mla_decode_capsule") = export_fn<DecodeFn>(&mla_decode);  // of the types kernel_fns.h declares
  m.attr("mla_decode_coded_capsule") = export_fn<CodedDecodeFn>(&mla_decode_coded);
  m.def("cache_kinds", [] {
    std::vector<std::string> names;
    for (const CacheKind& k : CACHE_KINDS) names.emplace_back(k.name);
    return names;
  }, "the caches mla_decode reads (cache_kinds.h), in the order of its cache_kind codes");
  def_isa_paths(m, PATHS);
}
