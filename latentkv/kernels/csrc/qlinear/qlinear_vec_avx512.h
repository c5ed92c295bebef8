// isa_avx512's lanes for qlinear_impl.h (16 floats of a __m512) and its blocking. Included inside
// `namespace isa_avx512` under its `#pragma GCC target` by each unit that needs the avx512 loops or
// their constants (qlinear_avx512.cpp, qlinear_amx.cpp). Nothing here may include a header.
struct Vec {
  static constexpr int W = 16;
  using T = __m512;
  static inline T zero() { return _mm512_setzero_ps(); }
  static inline T load(const float* p) { return _mm512_loadu_ps(p); }
  static inline void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static inline T set1(float v) { return _mm512_set1_ps(v); }
  static inline T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static inline T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static inline T add(T a, T b) { return _mm512_add_ps(a, b); }
  // nibble t (bits 4t..4t+3) of each lane's word in place, q * 16^t (t = 7: shifted down, q)
  static inline T nibble(const int32_t* words, int t) {
    const __m512i v = _mm512_loadu_si512(words);
    return _mm512_cvtepi32_ps(t == 7 ? _mm512_srli_epi32(v, 28) : _mm512_and_si512(v, _mm512_set1_epi32(15 << 4 * t)));
  }
  static inline T byte(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static inline T half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  // words of two bf16 (input k in the low half, k + 1 in the high), one of them widened: exact
  static inline T bf16_lo(const int32_t* w) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(w), 16)); }
  static inline T bf16_hi(const int32_t* w) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(w), _mm512_set1_epi32((int)0xffff0000u)));
  }
  static constexpr bool DPBF16 = false;
};
constexpr int TILE_MIN = 12, DIRECT_P = 4, DIRECT_MB = 6, TILE_BLOCKS = 2, TILE_P = 2, MB_TILE = 6;
