// Paged MLA decode over an int8 latent with VNNI integer dot products (avx512_vnni vpdpbusd), for
// bf16 queries. Included by attention_avx512_bf16.cpp (and attention_amx_int8.cpp) inside its namespace after
// mla_decode_bf16.h (BT, reduce16, the scratch). Its one include is mla_job.h (Job, TILE, the cache kinds, prefetch), guarded: a no-op here.
//
// The int8 codes are never widened: per tile of BT tokens
//   scores: the query's latent part is quantized once per call to int8 with a scale per row, in
//           two parts hi + lo / 256 (quantize_rows; one int8 part alone measured 3-5e-2 relative
//           output error, ten times the bf16 path's); q8 . code is vpdpbusd on (code xor 0x80) =
//           code + 128 as the unsigned operand (one load and xor feed both parts), the
//           128 * sum(q8) excess taken out through the accumulator's start; times q_scale x token
//           scale, plus the rope part in bf16 (vdpbf16ps).
//   values: the tile's codes are interleaved by 4 tokens once, for all heads; each row's weights
//           p_t x scale_t are quantized per tile to uint8 (0..255 of the tile's largest) and
//           acc_int32 += 4 weights . 4 codes is one vpdpbusd per 16 output lanes (four tokens
//           per instruction), added to the float32 row as acc * alpha + int * (largest / 255).
//           The interleave permutes lanes within each 64-wide chunk; `unpermute4` undoes it.
// Error: q rounded to ~16 bits per row and the weights to 8 bits per tile (2^-9 of the tile's
// largest); tests/attention/test_native.py states the tolerance.
// Requires kv_rank % 64 == 0 and a bf16 rope (mla_attention.cpp decode_loops picks mla_decode_bf16.h otherwise).
#include "mla_job.h"

static inline __m512 bf16x16_to_ps(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// n values of a bf16 row (n % 16 == 0) in int8 twice, v / qs ~ hi + lo / 256 (hi, lo in -127..127:
// ~2^-16 of the row's largest value, finer than its own bf16 rounding) -> qs = max|v| / 127 (1 for a
// zero row). Each lane is an IEEE division and two nearest-even roundings: the codes do not depend on
// the vector width. The VNNI path's latent query and the AMX int8 path's (mla_decode_amx_i8.h).
static inline float quantize_two_part(const uint16_t* v, int n, int8_t* hi, int8_t* lo) {
  __m512 top = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) top = _mm512_max_ps(top, _mm512_abs_ps(bf16x16_to_ps(v + i)));
  const float t = _mm512_reduce_max_ps(top), scale = t > 0.0f ? t / 127.0f : 1.0f;
  const __m512 sv = _mm512_set1_ps(scale), lim = _mm512_set1_ps(127.0f);
  for (int i = 0; i < n; i += 16) {
    const __m512 x = _mm512_div_ps(bf16x16_to_ps(v + i), sv);
    const __m512 h = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(x, h), _mm512_set1_ps(256.0f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    l = _mm512_max_ps(_mm512_min_ps(l, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
    _mm_storeu_si128((__m128i*)(hi + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(h)));
    _mm_storeu_si128((__m128i*)(lo + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(l)));
  }
  return scale;
}

// q [rows, D] bf16 -> q8 [rows, 2r]: the latent part in int8 twice (quantize_two_part: hi, then lo),
// qs [rows] the scale, qsum [rows, 2] the sums of hi and of lo.
static void quantize_rows(const uint16_t* q, int64_t rows, int D, int r, int8_t* q8, float* qs, int32_t* qsum) {
  for (int64_t m = 0; m < rows; ++m) {
    int8_t* hi = q8 + m * 2 * r;
    qs[m] = quantize_two_part(q + m * D, r, hi, hi + r);
    int32_t sum_hi = 0, sum_lo = 0;
    for (int i = 0; i < r; ++i) sum_hi += hi[i], sum_lo += hi[r + i];
    qsum[2 * m] = sum_hi, qsum[2 * m + 1] = sum_lo;
  }
}

// The BT rows' codes interleaved by 4 tokens: quads[g][64k + 16j + ...] over values 64k..64k+63.
static inline void quad_rows(const int8_t* const* lat, int r, int8_t* quads) {
  for (int g = 0; g < BT / 4; ++g) {
    const int8_t* const* rw = lat + 4 * g;
    int8_t* dst = quads + (int64_t)g * 4 * r;
    for (int i = 0; i < r; i += 64) {
      __m512i r0 = _mm512_loadu_si512((const void*)(rw[0] + i)), r1 = _mm512_loadu_si512((const void*)(rw[1] + i));
      __m512i r2 = _mm512_loadu_si512((const void*)(rw[2] + i)), r3 = _mm512_loadu_si512((const void*)(rw[3] + i));
      __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
      __m512i c = _mm512_unpacklo_epi8(r2, r3), d = _mm512_unpackhi_epi8(r2, r3);
      _mm512_storeu_si512((void*)(dst + 4 * i), _mm512_unpacklo_epi16(a, c));
      _mm512_storeu_si512((void*)(dst + 4 * i + 64), _mm512_unpackhi_epi16(a, c));
      _mm512_storeu_si512((void*)(dst + 4 * i + 128), _mm512_unpacklo_epi16(b, d));
      _mm512_storeu_si512((void*)(dst + 4 * i + 192), _mm512_unpackhi_epi16(b, d));
    }
  }
}

// sc[0..n) for one query row (see the header comment), eight tokens per pass.
static inline void scores_i8(const int8_t* q8, float qscale, const int32_t* qsum, const uint16_t* qrope,
                             const int8_t* const* lat, const uint16_t* const* rope, const float* tscale, int n, int r,
                             int dr, float* sc) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __m512i start_hi = _mm512_maskz_set1_epi32(1, -128 * qsum[0]), start_lo = _mm512_maskz_set1_epi32(1, -128 * qsum[1]);
  const int rfull = dr / 32;
  const __mmask32 rtail = (__mmask32)((1ull << (dr % 32)) - 1);
  __m512 acc[BT];
  const int groups = (n + 7) / 8;
  for (int g = 0; g < groups; ++g) {
    __m512i a[8], b[8];
    for (int i = 0; i < 8; ++i) a[i] = start_hi, b[i] = start_lo;
    for (int c = 0; c < r; c += 64) {
      __m512i qh = _mm512_loadu_si512((const void*)(q8 + c)), ql = _mm512_loadu_si512((const void*)(q8 + r + c));
      for (int i = 0; i < 8; ++i) {
        __m512i x = _mm512_xor_si512(_mm512_loadu_si512((const void*)(lat[g * 8 + i] + c)), flip);
        a[i] = _mm512_dpbusd_epi32(a[i], x, qh);
        b[i] = _mm512_dpbusd_epi32(b[i], x, ql);
      }
    }
    __m512 f[8];
    for (int i = 0; i < 8; ++i) {
      __m512 k = _mm512_set1_ps(qscale * tscale[g * 8 + i]);
      f[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(a[i]), k);
      f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b[i]), _mm512_mul_ps(k, _mm512_set1_ps(1.0f / 256.0f)), f[i]);
    }
    for (int c = 0; c < rfull; ++c) {
      __m512bh qc = as_bh(_mm512_loadu_si512((const void*)(qrope + 32 * c)));
      for (int i = 0; i < 8; ++i)
        f[i] = _mm512_dpbf16_ps(f[i], as_bh(_mm512_loadu_si512((const void*)(rope[g * 8 + i] + 32 * c))), qc);
    }
    if (rtail) {
      __m512bh qc = as_bh(_mm512_maskz_loadu_epi16(rtail, qrope + 32 * rfull));
      for (int i = 0; i < 8; ++i)
        f[i] = _mm512_dpbf16_ps(f[i], as_bh(_mm512_maskz_loadu_epi16(rtail, rope[g * 8 + i] + 32 * rfull)), qc);
    }
    for (int i = 0; i < 8; ++i) acc[g * 8 + i] = f[i];
  }
  for (int g = groups; g < (groups + 1) / 2 * 2; ++g)
    for (int i = 0; i < 8; ++i) acc[g * 8 + i] = _mm512_setzero_ps();
  for (int h = 0; h < groups; h += 2) _mm512_storeu_ps(sc + h * 8, reduce16(acc + h * 8));
}

// acc [NZ x 16] = acc * alpha + unit * sum over the tile's quads of (4 uint8 weights) . (4 codes).
template <int NZ>
static inline void values_i8(float* acc, const int8_t* quads, int r, const uint32_t* w, float alpha, float unit) {
  __m512i a[NZ];
  for (int z = 0; z < NZ; ++z) a[z] = _mm512_setzero_si512();
  for (int g = 0; g < BT / 4; ++g) {
    const __m512i wg = _mm512_set1_epi32((int)w[g]);
    const int8_t* src = quads + (int64_t)g * 4 * r;
    for (int z = 0; z < NZ; ++z) a[z] = _mm512_dpbusd_epi32(a[z], wg, _mm512_loadu_si512((const void*)(src + 64 * z)));
  }
  const __m512 al = _mm512_set1_ps(alpha), un = _mm512_set1_ps(unit);
  for (int z = 0; z < NZ; ++z)
    _mm512_storeu_ps(acc + 16 * z, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[z]), un, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * z), al)));
}

// Lane d of vector 4k + j holds value 64k + 16 (d / 4) + 4 j + d % 4: in each 64-wide chunk, a 4 x 4
// transpose of 128-bit lanes (vshuff32x4: moves, no rounding), as mla_decode_bf16.h's unpermute.
static inline void unpermute4(float* acc, int r) {
  for (int i = 0; i < r; i += 64) {
    const __m512 v0 = _mm512_loadu_ps(acc + i), v1 = _mm512_loadu_ps(acc + i + 16);
    const __m512 v2 = _mm512_loadu_ps(acc + i + 32), v3 = _mm512_loadu_ps(acc + i + 48);
    const __m512 t0 = _mm512_shuffle_f32x4(v0, v1, 0x44), t1 = _mm512_shuffle_f32x4(v0, v1, 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(v2, v3, 0x44), t3 = _mm512_shuffle_f32x4(v2, v3, 0xEE);
    _mm512_storeu_ps(acc + i, _mm512_shuffle_f32x4(t0, t2, 0x88));
    _mm512_storeu_ps(acc + i + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
    _mm512_storeu_ps(acc + i + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
    _mm512_storeu_ps(acc + i + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
  }
}

// One item as attend_span_bf16, int8 latent only: q [M, D] bf16 (rope part used), q8/qs/qsum from quantize_rows.
static void attend_span_i8(const Job& job, int64_t b, int64_t t0, int64_t t1, const uint16_t* q, const int8_t* q8,
                           const float* qs, const int32_t* qsum, const int64_t* lim, float* acc, float* mx, float* sum,
                           const Bf16Scratch& s, float* sc) {
  const int M = job.M, D = job.D, r = job.r, dr = job.D - job.r, bs = job.bs;
  const int64_t* table = job.block_tables + b * job.nb;
  for (int m = 0; m < M; ++m) mx[m] = -__builtin_inff(), sum[m] = 0.0f;
  for (int64_t i = 0; i < (int64_t)M * r; ++i) acc[i] = 0.0f;
  const int8_t* lat[BT];
  const uint16_t* rope[BT];
  float tscale[BT];
  alignas(64) uint8_t w8[BT];
  int8_t* quads = (int8_t*)s.pairs;
  for (int64_t j0 = t0; j0 < t1; j0 += BT) {
    int n = (int)(t1 - j0 < BT ? t1 - j0 : BT);
    const int64_t p0 = j0 + BT, p1 = j0 + 2 * BT < t1 ? j0 + 2 * BT : t1;  // the next tile
    for (int t = 0; t < BT; ++t) {
      if (t >= n) {
        lat[t] = (const int8_t*)s.zero, rope[t] = s.zero, tscale[t] = 0.0f;
        continue;
      }
      int64_t j = j0 + t, slot = table[j / bs] * bs + j % bs;
      lat[t] = (const int8_t*)job.latent + slot * r;
      rope[t] = (const uint16_t*)job.rope + slot * dr;
      tscale[t] = job.scale[slot];  // scale_stride 1: this path takes a bf16 rope only
    }
    quad_rows(lat, r, quads);
    for (int m = 0; m < M; ++m) {
      int64_t visible = lim[m] - j0;
      int nv = visible <= 0 ? 0 : (visible < n ? (int)visible : n);
      if (nv == 0) continue;
      prefetch_rows(job, table, p0, p1, m, M);
      scores_i8(q8 + (int64_t)m * 2 * r, qs[m], qsum + 2 * m, q + (int64_t)m * D + r, lat, rope, tscale, nv, r, dr, sc);
      float wmax, wt[BT];
      float alpha = softmax_tile(sc, nv, tscale, mx + m, sum + m, wt, &wmax);
      const __m512 inv = _mm512_set1_ps(wmax > 0.0f ? 255.0f / wmax : 0.0f);  // weights to 0..255 of the largest
      for (int h = 0; h < BT; h += 16)
        _mm_storeu_si128((__m128i*)(w8 + h), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(wt + h), inv))));
      float* am = acc + (int64_t)m * r;
      const uint32_t* w = (const uint32_t*)w8;
      float unit = wmax / 255.0f;
      int z = 0, nz = r / 16;
      for (; z + 16 <= nz; z += 16) values_i8<16>(am + 16 * z, quads + 64 * z, r, w, alpha, unit);
      for (; z < nz; z += 4) values_i8<4>(am + 16 * z, quads + 64 * z, r, w, alpha, unit);
    }
  }
  for (int m = 0; m < M; ++m) unpermute4(acc + (int64_t)m * r, r);
}
