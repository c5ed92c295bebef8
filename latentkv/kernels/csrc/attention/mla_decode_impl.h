// Paged MLA decode attention, one instruction set. Included once per ISA by attention_<isa>.cpp
// inside `namespace <isa>` under `#pragma GCC target(...)`: the loops below are written for
// the auto-vectorizer (`#pragma omp simd`), so each inclusion compiles to that ISA's vectors.
// Its one include is mla_job.h (Job, TILE, the cache kinds, prefetch), guarded: a no-op here, inside the namespace; exp_poly.h (e^x) is included
// before this file in each namespace.
//
// One work item = one sequence b and one span [t0, t1) of its cached tokens. The item reads
// each token's latent row once (through the block table, in place), widens it to float32 in
// an L1 tile (bf16: a shift; int8: times the token's scale; fp8 e4m3: a bit move, times
// 2^120 and the scale; q4_0: a nibble minus 8, times its group's scale), and uses the tile for all M = Q*H query rows: scores, online softmax
// (running max and sum per row) and the value accumulation, in one pass. Items of one
// sequence are merged by log-sum-exp in a fixed order (merge_row below), so the result does not
// depend on the batch or on the number of threads.
#include "mla_job.h"

static inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

static inline void widen_bf16(const uint16_t* __restrict src, float* __restrict dst, int n, float mul) {
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    uint32_t u = (uint32_t)src[i] << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    dst[i] = f * mul;
  }
}

static inline void widen_f32(const float* __restrict src, float* __restrict dst, int n, float mul) {
#pragma omp simd
  for (int i = 0; i < n; ++i) dst[i] = src[i] * mul;
}

static inline void widen_i8(const int8_t* __restrict src, float* __restrict dst, int n, float mul) {
#pragma omp simd
  for (int i = 0; i < n; ++i) dst[i] = (float)src[i] * mul;
}

static inline void widen_fp8(const uint8_t* __restrict src, float* __restrict dst, int n, float mul) {
  // e4m3fn bits s eeee mmm placed at f32 bits 31 and 26..20: the f32 exponent is the e4m3 one
  // (bias 127 instead of 7), so times 2^120 gives the value, subnormals included (no NaN codes:
  // the writer clamps to +-448).
  const float k = mul * 1.329227995784916e36f;  // 2^120
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    uint32_t b = src[i];
    uint32_t u = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
    float f;
    __builtin_memcpy(&f, &u, 4);
    dst[i] = f * k;
  }
}

// q4_0 codes of a row of n values (cache/q4.py's layout: per group of up to Q4_GROUP, byte j holds
// value j low and value j + half high) and its float16 scales -> dst [n] float32.
static inline void widen_q4(const uint8_t* __restrict src, const uint16_t* __restrict sc, float* __restrict dst, int n) {
  for (int g0 = 0; g0 < n; g0 += Q4_GROUP) {
    const int size = n - g0 < Q4_GROUP ? n - g0 : Q4_GROUP, half = (size + 1) / 2;
    const float d = f16_to_f32(sc[g0 / Q4_GROUP]);
    const uint8_t* b = src + g0 / 2;
    float* o = dst + g0;
#pragma omp simd
    for (int j = 0; j < half; ++j) o[j] = (float)((int)(b[j] & 15u) - 8) * d;
#pragma omp simd
    for (int j = 0; j < size - half; ++j) o[half + j] = (float)((int)(b[j] >> 4) - 8) * d;
  }
}

// A transform-coded token (TcLayout): codes [code_bytes], scales float16 [groups] -> dst [values]
// float32 in packed order, each value (code - offset) x step x its group's scale, as cache/coded.py decodes
// before its groups are turned back (the query was turned instead). A run writes its 16 lanes always,
// unmasked (a masked store cost more than the run's arithmetic): the lanes past its count land on the next
// run's columns, which that run writes after, or past the stored values, on columns written after them (the
// row's cos and sin, the next row; a tile has TC_SLACK values of room at its end for the last).

// The shifts of 8 values of b bits in one word (value i at bit i * b), one vector load.
alignas(64) static const uint64_t TC_SHIFTS[9][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0},          {0, 1, 2, 3, 4, 5, 6, 7},          {0, 2, 4, 6, 8, 10, 12, 14},
    {0, 3, 6, 9, 12, 15, 18, 21},      {0, 4, 8, 12, 16, 20, 24, 28},     {0, 5, 10, 15, 20, 25, 30, 35},
    {0, 6, 12, 18, 24, 30, 36, 42},    {0, 7, 14, 21, 28, 35, 42, 49},    {0, 8, 16, 24, 32, 40, 48, 56}};

// 8 values of b bits from bit `shift` of the bytes at src (src holds 24: a run's 16 and 8 of room) -> o[0..8).
static inline void widen_tc8(const uint8_t* src, int shift, int b, float off, float step, float* __restrict o) {
  const int at = shift >> 3, low = shift & 7;
  if (b == 8 && low) {  // 64 bits from bit `low`: past one word, so byte by byte
#pragma omp simd
    for (int i = 0; i < 8; ++i)
      o[i] = ((float)((((uint32_t)src[at + i] | (uint32_t)src[at + i + 1] << 8) >> low) & 255u) - off) * step;
    return;
  }
  uint64_t w;
  __builtin_memcpy(&w, src + at, 8);
  w >>= low;
  const uint64_t mask = (1ull << b) - 1;
  const uint64_t* __restrict shifts = TC_SHIFTS[b];
#pragma omp simd
  for (int i = 0; i < 8; ++i) o[i] = ((float)(uint32_t)((w >> shifts[i]) & mask) - off) * step;
}

#ifdef LATENTKV_TC_AVX512
// Where each of 16 values of b bits starting at bit `shift` of 16 bytes lies: the pair of bytes vpshufb
// gathers into its 16-bit lane (0x80: none, the byte past the 16) and the shift vpsrlvw takes it down by.
struct TcLanes {
  alignas(32) uint8_t index[9][8][32];
  alignas(32) uint16_t shift[9][8][16];
  constexpr TcLanes() : index{}, shift{} {
    for (int b = 1; b <= 8; ++b)
      for (int s = 0; s < 8; ++s)
        for (int i = 0; i < 16; ++i) {
          const int bit = s + i * b, k = bit >> 3;
          // vpshufb: each 128-bit half picks from its own copy of the 16 bytes
          index[b][s][2 * i] = (uint8_t)(k < 16 ? k : 0x80);
          index[b][s][2 * i + 1] = (uint8_t)(k + 1 < 16 ? k + 1 : 0x80);
          shift[b][s][i] = (uint16_t)(bit & 7);
        }
  }
};
static constexpr TcLanes TC_LANES{};

// 16 values of b bits from bit `shift` (< 8) of the 16 bytes at src, (code - off) x step: one byte shuffle,
// one 16-bit shift.
static inline __m512 tc_run16(const uint8_t* src, int shift, int b, float off, float step) {
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)src));
  __m256i words = _mm256_shuffle_epi8(bytes, _mm256_load_si256((const __m256i*)TC_LANES.index[b][shift]));
  words = _mm256_srlv_epi16(words, _mm256_load_si256((const __m256i*)TC_LANES.shift[b][shift]));
  words = _mm256_and_si256(words, _mm256_set1_epi16((short)((1 << b) - 1)));
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(words));
  return _mm512_mul_ps(_mm512_sub_ps(v, _mm512_set1_ps(off)), _mm512_set1_ps(step));
}

// One chunk of a token's row (TcChunk) from its codes -> columns 0-15 and 16-31 of it, float32: (code -
// off) x m[group], m_lo / m_hi the token's STEP x scale of groups 0-15 / 16-31. Two loads, one word
// permute, one shift; the same arithmetic as a run's.
static inline void tc_chunk32(const TcChunk& ch, const uint8_t* codes, __m512 m_lo, __m512 m_hi, __m512& lo, __m512& hi) {
  // plain loads where both 64-byte windows lie inside the token's codes (every lane set: a masked load
  // costs more on Zen 4 all the same)
  const bool inside = (ch.load_a & ch.load_b) == ~0ull;
  const __m512i a = inside ? _mm512_loadu_si512((const void*)(codes + ch.base)) : _mm512_maskz_loadu_epi8(ch.load_a, codes + ch.base);
  const __m512i b =
      inside ? _mm512_loadu_si512((const void*)(codes + ch.base + 1)) : _mm512_maskz_loadu_epi8(ch.load_b, codes + ch.base + 1);
  __m512i w = _mm512_permutex2var_epi16(a, _mm512_load_si512((const void*)ch.index), b);
  w = _mm512_and_si512(_mm512_srlv_epi16(w, _mm512_load_si512((const void*)ch.shift)), _mm512_load_si512((const void*)ch.mask));
  const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)));
  const __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)));
  const __m512 s0 = _mm512_permutex2var_ps(m_lo, _mm512_load_si512((const void*)ch.group), m_hi);
  const __m512 s1 = _mm512_permutex2var_ps(m_lo, _mm512_load_si512((const void*)(ch.group + 16)), m_hi);
  lo = _mm512_mul_ps(_mm512_sub_ps(v0, _mm512_load_ps(ch.off)), s0);
  hi = _mm512_mul_ps(_mm512_sub_ps(v1, _mm512_load_ps(ch.off + 16)), s1);
}

// A token's STEP x scale of every group (the chunks' m_lo, m_hi), as a run's step is: STEP times the float16
// scale widened.
static inline void tc_group_steps(const TcLayout& tc, const uint16_t* __restrict sc, __m512& m_lo, __m512& m_hi) {
  const int g = tc.groups;
  const __mmask16 k0 = (__mmask16)(g >= 16 ? 0xFFFF : (1u << g) - 1), k1 = (__mmask16)(g >= 32 ? 0xFFFF : g > 16 ? (1u << (g - 16)) - 1 : 0);
  m_lo = _mm512_mul_ps(_mm512_load_ps(tc.group_step), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k0, sc)));
  m_hi = _mm512_mul_ps(_mm512_load_ps(tc.group_step + 16), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k1, sc + 16)));
}
#endif

// Calls run(r, src, off, step) for each run r (TC_RUN fields) of a token: src its bytes (24 readable),
// off and step (STEP[bits] x its group's scale) its values' arithmetic. The runs before tc.inner read their
// 24 bytes inside the token's codes, in place; the last few (at most two: a run spans 16 bytes) from a
// copy with room, so that nothing past the codes is read (the cache's last slot ends there).
template <class Run>
static inline void tc_runs(const TcLayout& tc, const uint8_t* __restrict codes, const uint16_t* __restrict sc, Run run) {
  float scale[TC_MAX_GROUPS];  // the token's group scales, widened once (not once per run)
#ifdef LATENTKV_TC_AVX512
  for (int g = 0; g < tc.groups; g += 16) {
    const __mmask16 m = (__mmask16)(tc.groups - g >= 16 ? 0xFFFF : (1u << (tc.groups - g)) - 1);
    _mm512_mask_storeu_ps(scale + g, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc + g)));
  }
#else
#pragma omp simd
  for (int g = 0; g < tc.groups; ++g) scale[g] = f16_to_f32(sc[g]);
#endif
  const int32_t* __restrict r = tc.runs;
  const float* __restrict steps = tc.steps;
  const int inner = tc.inner, n_runs = tc.n_runs, code_bytes = tc.code_bytes;  // (in registers: run's stores may alias tc)
  int k = 0;
  for (; k < inner; ++k, r += TC_RUN, steps += 2) run(r, codes + r[0], steps[1], steps[0] * scale[r[5]]);
  if (k == n_runs) return;
  alignas(16) uint8_t tail[48] = {};  // the codes from the first outer run's byte (< 24), and room
  const int at = r[0];
  for (int i = 0; at + i < code_bytes; ++i) tail[i] = codes[at + i];
  for (; k < n_runs; ++k, r += TC_RUN, steps += 2) run(r, tail + (r[0] - at), steps[1], steps[0] * scale[r[5]]);
}

static inline void widen_tc(const TcLayout& tc, const uint8_t* __restrict codes, const uint16_t* __restrict sc,
                            float* __restrict dst) {
#ifdef LATENTKV_TC_AVX512
  if (tc.n_chunks) {
    __m512 m_lo, m_hi, lo, hi;
    tc_group_steps(tc, sc, m_lo, m_hi);
    const TcChunk* chunks = tc.chunks;
    const int n_chunks = tc.n_chunks;  // (in registers: the stores may alias tc)
    for (int c = 0; c < n_chunks; ++c) {
      tc_chunk32(chunks[c], codes, m_lo, m_hi, lo, hi);
      _mm512_storeu_ps(dst + 32 * c, lo);
      _mm512_storeu_ps(dst + 32 * c + 16, hi);
    }
    return;
  }
#endif
  tc_runs(tc, codes, sc, [dst](const int32_t* r, const uint8_t* src, float off, float step) {
#ifdef LATENTKV_TC_AVX512
    _mm512_storeu_ps(dst + r[4], tc_run16(src, r[1], r[2], off, step));  // all 16 lanes: see above
#else
    widen_tc8(src, r[1], r[2], off, step, dst + r[4]);
    widen_tc8(src, r[1] + 8 * r[2], r[2], off, step, dst + r[4] + 8);
#endif
  });
}

// Widen token j of sequence `table` into dst [D] float32. Not through memmove: GCC turns the
// float32 rope's copy into a libc call per token (~10% of the AVX2 kernel at 8K), where the
// vector loop is a dozen loads and stores.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) static inline void load_row(const Job& job,
                                                                                          const int64_t* table,
                                                                                          int64_t j, float* dst) {
  const int D = job.D, r = job.r, dr = job.D - job.r, bs = job.bs;
  const int64_t slot = table[j / bs] * bs + j % bs;
  switch (job.kind) {
    case KIND_F32: widen_f32((const float*)job.kv + slot * D, dst, D, 1.0f); break;
    case KIND_BF16: widen_bf16((const uint16_t*)job.kv + slot * D, dst, D, 1.0f); break;
    case KIND_TC: {
      const TcLayout& tc = job.tc;
      widen_tc(tc, (const uint8_t*)job.latent + slot * tc.code_bytes, job.scale16 + slot * tc.groups, dst);
      widen_f32(tc.cs + j * tc.cs_width, dst + tc.values, tc.cs_width, 1.0f);
      break;
    }
    case KIND_Q4: {
      const uint16_t* sc = job.scale16 + slot * job.scale_stride;
      widen_q4((const uint8_t*)job.latent + slot * q4_bytes(r), sc, dst, r);
      widen_q4((const uint8_t*)job.rope + slot * q4_bytes(dr), sc + q4_groups(r), dst + r, dr);
      break;
    }
    default: {
      const float* sc = job.scale + slot * job.scale_stride;
      if (job.kind == KIND_I8) widen_i8((const int8_t*)job.latent + slot * r, dst, r, sc[0]);
      else widen_fp8((const uint8_t*)job.latent + slot * r, dst, r, sc[0]);
      if (job.rope_i8) widen_i8((const int8_t*)job.rope + slot * dr, dst + r, dr, sc[1]);
      else if (job.rope_bf16) widen_bf16((const uint16_t*)job.rope + slot * dr, dst + r, dr, 1.0f);
      else widen_f32((const float*)job.rope + slot * dr, dst + r, dr, 1.0f);
    }
  }
}

// Widen token rows [j0, j0 + n) of sequence `table` into tile [n, D] float32.
static inline void load_tile(const Job& job, const int64_t* table, int64_t j0, int n, float* tile) {
  for (int t = 0; t < n; ++t) load_row(job, table, j0 + t, tile + (int64_t)t * job.D);
}

// Scores of one query row against n tokens of the tile, four tokens per pass: four independent
// accumulators (one would make the FMA latency, not the loads, the limit) sharing each q load.
static inline void scores(const float* __restrict q, const float* __restrict tile, int n, int D, float* __restrict sc) {
  int t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k0 = tile + (int64_t)t * D;
    const float *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int d = 0; d < D; ++d) {
      float qd = q[d];
      s0 += qd * k0[d];
      s1 += qd * k1[d];
      s2 += qd * k2[d];
      s3 += qd * k3[d];
    }
    sc[t] = s0, sc[t + 1] = s1, sc[t + 2] = s2, sc[t + 3] = s3;
  }
  for (; t < n; ++t) sc[t] = dot(q, tile + (int64_t)t * D, D);
}

// One item: rows' running (max, sum, acc) over tokens [t0, t1) of sequence b.
// q [M, D] float32, lim [M] visible keys per row; writes acc [M, r], mx [M], sum [M].
static void attend_span(const Job& job, int64_t b, int64_t t0, int64_t t1, const float* q, const int64_t* lim,
                        float* acc, float* mx, float* sum, float* tile, float* sc) {
  const int M = job.M, D = job.D, r = job.r;
  const int64_t* table = job.block_tables + b * job.nb;
  for (int m = 0; m < M; ++m) {
    mx[m] = -__builtin_inff();
    sum[m] = 0.0f;
  }
  for (int64_t i = 0; i < (int64_t)M * r; ++i) acc[i] = 0.0f;
  for (int64_t j0 = t0; j0 < t1; j0 += TILE) {
    int n = (int)(t1 - j0 < TILE ? t1 - j0 : TILE);
    load_tile(job, table, j0, n, tile);
    for (int64_t i = (int64_t)n * D; i < (int64_t)TILE * D; ++i) tile[i] = 0.0f;  // rows past the span: weight 0
    for (int m = 0; m < M; ++m) {
      int64_t visible = lim[m] - j0;  // rows see keys j < lim[m]
      int nv = visible <= 0 ? 0 : (visible < n ? (int)visible : n);
      if (nv == 0) continue;
      scores(q + (int64_t)m * D, tile, nv, D, sc);
      float tmax = -__builtin_inff();
      for (int t = 0; t < nv; ++t) tmax = sc[t] > tmax ? sc[t] : tmax;
      float old = mx[m], now = tmax > old ? tmax : old;
      float alpha = exp_poly(old - now);  // 1 when the max holds; ~0 from -inf (acc and sum are 0 then)
      mx[m] = now;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int t = 0; t < nv; ++t) {
        sc[t] = exp_poly(sc[t] - now);
        s += sc[t];
      }
      sum[m] = sum[m] * alpha + s;
      // values: each acc element once per tile (not once per token), the tile's tokens summed in order
      float* am = acc + (int64_t)m * r;
      for (int t = nv; t < TILE; ++t) sc[t] = 0.0f;  // a fixed trip count below: the i loop vectorizes
#pragma omp simd
      for (int i = 0; i < r; ++i) {
        float a = am[i] * alpha;
#pragma GCC unroll 16
        for (int t = 0; t < TILE; ++t) a += sc[t] * tile[(int64_t)t * D + i];
        am[i] = a;
      }
    }
  }
}

// The log-sum-exp merge of one query row's spans, in span order: row [r] (scratch) = sum over the
// items of exp(mx_it - top) * acc_it, written out times 1 / sum(exp(mx_it - top) * sum_it) as float32
// (out32) or bf16 rounded to nearest even (out16; NaN a quiet NaN). acc / mx / sum: the first item's,
// `stride` floats (acc: stride * r) to the next. Vectorized at the ISA's width; each lane's sum is
// the same sequence of float32 operations whatever the width (the bits of every path).
static void merge_row(const float* acc, const float* mx, const float* sum, int64_t items, int64_t stride, int r,
                      float* __restrict row, float* out32, uint16_t* out16) {
  float top = -__builtin_inff();
  for (int64_t it = 0; it < items; ++it) top = mx[it * stride] > top ? mx[it * stride] : top;
  float total = 0.0f;
#pragma omp simd
  for (int i = 0; i < r; ++i) row[i] = 0.0f;
  for (int64_t it = 0; it < items; ++it) {
    const float s = sum[it * stride];
    if (s == 0.0f) continue;  // no visible key in this span
    const float w = __builtin_expf(mx[it * stride] - top);
    total += w * s;
    const float* __restrict a = acc + it * stride * r;
#pragma omp simd
    for (int i = 0; i < r; ++i) row[i] += w * a[i];
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  if (out32) {
#pragma omp simd
    for (int i = 0; i < r; ++i) out32[i] = row[i] * inv;
    return;
  }
#pragma omp simd
  for (int i = 0; i < r; ++i) {
    const float f = row[i] * inv;
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out16[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
  }
}
