// isa_avx2's lanes for qlinear_impl.h (8 floats of a __m256) and its blocking. Included inside
// `namespace isa_avx2` under its `#pragma GCC target` (qlinear_avx2.cpp; qlinear_avx512.cpp for the
// quantizer its VNNI path shares). Nothing here may include a header.
struct Vec {
  static constexpr int W = 8;
  using T = __m256;
  static inline T zero() { return _mm256_setzero_ps(); }
  static inline T load(const float* p) { return _mm256_loadu_ps(p); }
  static inline void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static inline T set1(float v) { return _mm256_set1_ps(v); }
  static inline T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static inline T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static inline T add(T a, T b) { return _mm256_add_ps(a, b); }
  static inline T nibble(const int32_t* words, int t) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
    return _mm256_cvtepi32_ps(t == 7 ? _mm256_srli_epi32(v, 28) : _mm256_and_si256(v, _mm256_set1_epi32(15 << 4 * t)));
  }
  static inline T byte(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline T half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static inline T bf16_lo(const int32_t* w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), 16));
  }
  static inline T bf16_hi(const int32_t* w) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)),
                                                _mm256_set1_epi32((int)0xffff0000u)));
  }
  static constexpr bool DPBF16 = false;
};
constexpr int TILE_MIN = 4, DIRECT_P = 4, DIRECT_MB = 3, TILE_BLOCKS = 3, TILE_P = 3, MB_TILE = 4;
