// Cache codes widened to bf16 in registers for the bf16 dot-product decode (mla_decode_bf16.h, and the
// amx units through it). Included by mla_decode_bf16.h inside its ISA namespace, under that unit's
// target pragma (AVX-512 BW / BF16 intrinsics): each namespace compiles its own copy, so no guard.

// 32 int8 codes -> their values as bf16 (exact), lanes in order. Unmasked loads where the codes are
// whole: on Zen 4 masked loads and stores cost more than plain ones even with every lane set
// (~7% of the SmolLM2-shaped decode at 32 x 512).
static inline __m512i widen_i8x32(const int8_t* c) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)c)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(c + 16))));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// The same for a last partial chunk: mlo / mhi the codes of each half that are read (the others zero,
// never loaded).
static inline __m512i widen_i8x32(const int8_t* c, __mmask16 mlo, __mmask16 mhi) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mlo, c)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mhi, c + 16)));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// n int8 codes (or e4m3 bits: fp8) -> their values as bf16 in dst, exactly (an int8 or an e4m3
// value fits bf16's 8-bit significand); 32 at a time, plain loads and stores for whole chunks, a last
// partial one masked (no byte past src + n read, no word past dst + n written).
static inline void widen_codes(const void* src, uint16_t* dst, int n, bool fp8) {
  for (int i = 0; i < n; i += 32) {
    const int left = n - i;
    const bool whole = left >= 32;
    const __mmask16 mlo = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const __mmask16 mhi = whole ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : (__mmask16)0;
    __m512i v;
    if (!fp8) {
      v = whole ? widen_i8x32((const int8_t*)src + i) : widen_i8x32((const int8_t*)src + i, mlo, mhi);
    } else {  // e4m3 bits -> f32 bits 31, 26..20, times 2^120 (see widen_fp8)
      const uint8_t* c = (const uint8_t*)src + i;
      const __m128i c0 = whole ? _mm_loadu_si128((const __m128i*)c) : _mm_maskz_loadu_epi8(mlo, c);
      const __m128i c1 = whole ? _mm_loadu_si128((const __m128i*)(c + 16)) : _mm_maskz_loadu_epi8(mhi, c + 16);
      __m512i b0 = _mm512_cvtepu8_epi32(c0), b1 = _mm512_cvtepu8_epi32(c1);
      const __m512i sign = _mm512_set1_epi32(0x80), mag = _mm512_set1_epi32(0x7F);
      const __m512 e120 = _mm512_set1_ps(1.329227995784916e36f);  // 2^120: see widen_fp8
      const __m512 lo = _mm512_mul_ps(e120, _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(b0, sign), 24),
                                                                                 _mm512_slli_epi32(_mm512_and_si512(b0, mag), 20))));
      const __m512 hi = _mm512_mul_ps(e120, _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(b1, sign), 24),
                                                                                 _mm512_slli_epi32(_mm512_and_si512(b1, mag), 20))));
      v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    if (whole)
      _mm512_storeu_si512((void*)(dst + i), v);
    else
      _mm512_mask_storeu_epi16((void*)(dst + i), (__mmask32)((1ull << left) - 1), v);
  }
}

// n int8 codes times scale, each product rounded to bf16 into dst, 16 at a time, a last partial vector
// masked. vcvtneps2bf16 rounds to nearest even as torch does but flushes a denormal product to zero: one
// needs a scale below 2^-126 (a rope key under ~1e-36, nothing to any score); round_bf16x16's integer
// rounding, which keeps them, took 1.06x the kernel's time (SmolLM2's shape, 32 x 512, one process).
static inline void scale_codes(const int8_t* src, float scale, uint16_t* dst, int n) {
  const __m512 s = _mm512_set1_ps(scale);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(src + i)))), s);
    _mm256_storeu_si256((__m256i*)(dst + i), (__m256i)_mm512_cvtneps_pbh(v));
  }
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, src + i))), s);
    _mm256_mask_storeu_epi16((void*)(dst + i), m, (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// n floats rounded to bf16 as torch rounds them (nearest even on the bits, denormals kept; no NaN here)
// into dst, 16 at a time, a last partial vector masked.
static inline __m256i round_bf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16));
}

static inline void round_bf16(const float* src, uint16_t* dst, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i*)(dst + i), round_bf16x16(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16((void*)(dst + i), m, round_bf16x16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}
