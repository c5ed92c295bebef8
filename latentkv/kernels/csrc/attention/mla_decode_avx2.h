// Paged MLA decode for float32 queries with AVX2 + FMA intrinsics. Included by attention_avx2.cpp
// inside `namespace isa_avx2` under its target pragma, after exp_poly.h (e^x) and mla_decode_impl.h
// (Job, load_row). Its one include is mla_job.h (Job, TILE, the cache kinds, prefetch), guarded: a no-op here.
//
// Same work items, tile (TILE tokens widened to float32 by load_row: a float32 / bf16 cache,
// or int8 / fp8 codes times the token's scale), online softmax and merge as mla_decode_impl.h;
// what differs is the inner arithmetic, so that loads, not the vector units, stop limiting it
// (the auto-vectorized loops there load one tile vector and one broadcast per FMA):
//   scores: three query rows (heads) x four tokens per pass: each 8-float chunk of a row is loaded
//           once for three heads and each query chunk once for four tokens (12 accumulators);
//   values: three rows x 32 output lanes per pass: each tile vector is loaded once for three heads.
// A row's arithmetic is the same whether it runs in a group of three or alone (the groups only
// share loads): scores reduce over D in 8 lanes, chunk by chunk, then by one fixed tree
// (reduce4); values accumulate token by token in order. So results do not depend on the batch.
#include "mla_job.h"

// Lanes 0..3 = the horizontal sums of a, b, c, d, each by the same tree:
// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)).
static inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // pairs
  __m256 abcd = _mm256_hadd_ps(ab, cd);                          // quads, per 128-bit half
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Lanes i < n all ones: the mask of a tail chunk of n (< 8) floats.
static inline __m256i tail_mask(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

// sc[g * TILE + t] = q_g . tile[t] for G rows q_g = q + g * D and tokens t < n4 (a multiple of 4,
// <= TILE; the tile's rows past its tokens are zeros).
template <int G>
static inline void scores_avx2(const float* q, const float* tile, int n4, int D, float* sc) {
  const int full = D / 8;
  const __m256i tail = tail_mask(D % 8);
  for (int t = 0; t < n4; t += 4) {
    const float* k = tile + (int64_t)t * D;
    __m256 a[G][4];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 4; ++i) a[g][i] = _mm256_setzero_ps();
    for (int c = 0; c < full; ++c) {
      __m256 qc[G];
      for (int g = 0; g < G; ++g) qc[g] = _mm256_loadu_ps(q + g * D + 8 * c);
      for (int i = 0; i < 4; ++i) {
        __m256 x = _mm256_loadu_ps(k + i * D + 8 * c);
        for (int g = 0; g < G; ++g) a[g][i] = _mm256_fmadd_ps(qc[g], x, a[g][i]);
      }
    }
    if (D % 8) {
      __m256 qc[G];
      for (int g = 0; g < G; ++g) qc[g] = _mm256_maskload_ps(q + g * D + 8 * full, tail);
      for (int i = 0; i < 4; ++i) {
        __m256 x = _mm256_maskload_ps(k + i * D + 8 * full, tail);
        for (int g = 0; g < G; ++g) a[g][i] = _mm256_fmadd_ps(qc[g], x, a[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) _mm_storeu_ps(sc + g * TILE + t, reduce4(a[g][0], a[g][1], a[g][2], a[g][3]));
  }
}

// o_g[off .. off + 8 NZ) = o_g * alpha_g + sum over the tile's TILE tokens of p_g[t] * tile[t],
// for G rows at once (p rows past a row's visible tokens are 0).
template <int G, int NZ>
static inline void values_avx2(float* const* o, int off, const float* tile, int D, const float* p, const float* alpha) {
  __m256 a[G][NZ];
  for (int g = 0; g < G; ++g)
    for (int z = 0; z < NZ; ++z) a[g][z] = _mm256_mul_ps(_mm256_loadu_ps(o[g] + off + 8 * z), _mm256_set1_ps(alpha[g]));
  for (int t = 0; t < TILE; ++t) {
    __m256 w[G];
    for (int g = 0; g < G; ++g) w[g] = _mm256_broadcast_ss(p + g * TILE + t);
    const float* x = tile + (int64_t)t * D + off;
    for (int z = 0; z < NZ; ++z) {
      __m256 v = _mm256_loadu_ps(x + 8 * z);
      for (int g = 0; g < G; ++g) a[g][z] = _mm256_fmadd_ps(w[g], v, a[g][z]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int z = 0; z < NZ; ++z) _mm256_storeu_ps(o[g] + off + 8 * z, a[g][z]);
}

// The same for the r % 8 output lanes past the last whole vector, one lane at a time (same order).
template <int G>
static inline void values_tail(float* const* o, int off, int n, const float* tile, int D, const float* p,
                               const float* alpha) {
  for (int g = 0; g < G; ++g)
    for (int i = off; i < off + n; ++i) {
      float a = o[g][i] * alpha[g];
      for (int t = 0; t < TILE; ++t) a = __builtin_fmaf(p[g * TILE + t], tile[(int64_t)t * D + i], a);
      o[g][i] = a;
    }
}

// One row's online-softmax step over the tile's scores s[0..nv): updates *mx, *sum; p[0..TILE)
// gets the probabilities (0 from nv on); returns alpha, the rescale of the row's earlier sums.
// e^x eight lanes at a time (exp_poly on __m256: the scalar loop was ~15% of the kernel at 8K);
// the tile's sum by one fixed tree. Scores past nv may be garbage: the mask zeroes them (NaN too).
static_assert(TILE == 16, "softmax_row handles a tile as two vectors");
static inline float softmax_row(const float* s, int nv, float* mx, float* sum, float* p) {
  float tmax = -__builtin_inff();
  for (int t = 0; t < nv; ++t) tmax = s[t] > tmax ? s[t] : tmax;
  float old = *mx, now = tmax > old ? tmax : old;
  float alpha = exp_poly(old - now);  // 1 when the max holds; ~0 from -inf (acc and sum are 0 then)
  *mx = now;
  const __m256 nw = _mm256_set1_ps(now);
  const __m256 p0 = _mm256_and_ps(_mm256_castsi256_ps(tail_mask(nv)), exp_poly(_mm256_sub_ps(_mm256_loadu_ps(s), nw)));
  const __m256 p1 = _mm256_and_ps(_mm256_castsi256_ps(tail_mask(nv - 8)), exp_poly(_mm256_sub_ps(_mm256_loadu_ps(s + 8), nw)));
  _mm256_storeu_ps(p, p0);
  _mm256_storeu_ps(p + 8, p1);
  const __m256 a = _mm256_add_ps(p0, p1);
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  const float total = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  *sum = *sum * alpha + total;
  return alpha;
}

// G query rows m0 .. m0+G-1 over one widened tile of n tokens: scores, online softmax, values.
// A row with no visible token here keeps its state exactly (alpha 1, weights 0).
template <int G>
static inline void attend_tile_avx2(const Job& job, int m0, int64_t j0, int n, const float* q, const int64_t* lim,
                                    const float* tile, float* acc, float* mx, float* sum) {
  const int D = job.D, r = job.r;
  int nv[G], most = 0;
  for (int g = 0; g < G; ++g) {
    int64_t visible = lim[m0 + g] - j0;
    nv[g] = visible <= 0 ? 0 : (visible < n ? (int)visible : n);
    most = nv[g] > most ? nv[g] : most;
  }
  if (most == 0) return;
  alignas(32) float sc[G * TILE], p[G * TILE];
  scores_avx2<G>(q + (int64_t)m0 * D, tile, (most + 3) / 4 * 4, D, sc);
  float alpha[G];
  float* o[G];
  for (int g = 0; g < G; ++g) {
    o[g] = acc + (int64_t)(m0 + g) * r;
    if (nv[g] == 0) {
      alpha[g] = 1.0f;
      for (int t = 0; t < TILE; ++t) p[g * TILE + t] = 0.0f;
      continue;
    }
    alpha[g] = softmax_row(sc + g * TILE, nv[g], mx + m0 + g, sum + m0 + g, p + g * TILE);
  }
  const int nz = r / 8;
  int z = 0;
  for (; z + 4 <= nz; z += 4) values_avx2<G, 4>(o, 8 * z, tile, D, p, alpha);
  if (nz - z == 3) values_avx2<G, 3>(o, 8 * z, tile, D, p, alpha);
  if (nz - z == 2) values_avx2<G, 2>(o, 8 * z, tile, D, p, alpha);
  if (nz - z == 1) values_avx2<G, 1>(o, 8 * z, tile, D, p, alpha);
  if (r % 8) values_tail<G>(o, 8 * nz, r % 8, tile, D, p, alpha);
}

static inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = (const char*)p;
  for (int64_t i = 0; i < bytes; i += 64) prefetch_l1(c + i);
  prefetch_l1(c + bytes - 1);
}

// Ask for the cache row of token j of sequence `table` ahead of load_row.
static inline void prefetch_row(const Job& job, const int64_t* table, int64_t j) {
  const int D = job.D, r = job.r, dr = job.D - job.r, bs = job.bs;
  const int64_t slot = table[j / bs] * bs + j % bs;
  const int rope_bytes = dr * (job.rope_i8 ? 1 : job.rope_bf16 ? 2 : 4);
  switch (job.kind) {
    case KIND_F32: prefetch_bytes((const float*)job.kv + slot * D, 4 * D); break;
    case KIND_BF16: prefetch_bytes((const uint16_t*)job.kv + slot * D, 2 * D); break;
    case KIND_TC:
      prefetch_bytes((const uint8_t*)job.latent + slot * job.tc.code_bytes, job.tc.code_bytes);
      prefetch_l1(job.scale16 + slot * job.tc.groups);
      break;
    case KIND_Q4:
      prefetch_bytes((const uint8_t*)job.latent + slot * q4_bytes(r), q4_bytes(r));
      prefetch_bytes((const uint8_t*)job.rope + slot * q4_bytes(dr), q4_bytes(dr));
      prefetch_l1(job.scale16 + slot * job.scale_stride);
      break;
    default:
      prefetch_bytes((const int8_t*)job.latent + slot * r, r);
      prefetch_bytes((const char*)job.rope + slot * rope_bytes, rope_bytes);
      prefetch_l1(job.scale + slot * job.scale_stride);
  }
}

// attend_span (mla_decode_impl.h) with the kernels above: one item, q float32 [M, D]. While a
// tile is widened, the next tile's rows are prefetched, a token each (the blocks are scattered:
// the hardware prefetcher loses the stream at every block boundary, and the misses stalled the
// widening ~30% of the kernel's time).
static void attend_span_fast(const Job& job, int64_t b, int64_t t0, int64_t t1, const float* q, const int64_t* lim,
                             float* acc, float* mx, float* sum, float* tile, float* sc) {
  (void)sc;
  const int M = job.M, D = job.D, r = job.r;
  const int64_t* table = job.block_tables + b * job.nb;
  for (int m = 0; m < M; ++m) mx[m] = -__builtin_inff(), sum[m] = 0.0f;
  for (int64_t i = 0; i < (int64_t)M * r; ++i) acc[i] = 0.0f;
  for (int64_t j = t0; j < t1 && j < t0 + TILE; ++j) prefetch_row(job, table, j);
  for (int64_t j0 = t0; j0 < t1; j0 += TILE) {
    int n = (int)(t1 - j0 < TILE ? t1 - j0 : TILE);
    for (int t = 0; t < n; ++t) {
      if (j0 + TILE + t < t1) prefetch_row(job, table, j0 + TILE + t);
      load_row(job, table, j0 + t, tile + (int64_t)t * D);
    }
    for (int64_t i = (int64_t)n * D; i < (int64_t)TILE * D; ++i) tile[i] = 0.0f;  // rows past the span: weight 0
    const int groups = M / 3;  // query rows three at a time (the bundled model's 9 heads: three groups)
    for (int g = 0; g < groups; ++g) attend_tile_avx2<3>(job, 3 * g, j0, n, q, lim, tile, acc, mx, sum);
    for (int m = 3 * groups; m < M; ++m) attend_tile_avx2<1>(job, m, j0, n, q, lim, tile, acc, mx, sum);
  }
}
