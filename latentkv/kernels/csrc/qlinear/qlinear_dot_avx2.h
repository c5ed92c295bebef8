// Integer-dot weight formats and the activations' quantizer on AVX2 for qlinear_dot_impl.h (maddubs:
// u8 x s8 byte pairs into int16, madd into int32). Included by qlinear_avx2.cpp inside `namespace
// isa_avx2` after qlinear_impl.h; the AVX-512 VNNI path (qlinear_dot_vnni.h) quantizes with this
// quantize_group too. Nothing here may include a header.

// Integer-dot formats (qlinear_dot_impl.h). w4a8: rows p and p + 4 of each 8-row half share 32 bytes
// (slots 2p, 2p + 1; qlinear.py W4A8_SLOTS), so three hadds leave the 8 rows' sums in lane order;
// byte j of a row holds input j (low nibble) and input j + 16 (high). maddubs (u8 codes x s8
// activations, pairs to i16: at most 2 * 15 * 127) then madd (-> i32): exact.
template <int S>
struct W4T : CodesInPlace {
  static constexpr int SUBS = S;  // sub-blocks of 32 inputs a group
  static constexpr int SUB = BLOCK * 16, REC = SUBS * SUB + 2 * BLOCK * 2, SCALE = SUBS * SUB;
  static constexpr bool MIN = true;
  using Int = __m256i;
  static inline __m256 scale(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + lane); }
  static inline __m256 min(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + BLOCK + lane); }
  static inline Int first(int32_t) { return _mm256_setzero_si256(); }
  static inline __m256 to_float(Int acc) { return _mm256_cvtepi32_ps(acc); }
  static inline Int add(Int acc, const Codes& c, const int8_t* x) {
    const __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256i s[4];
    for (int p = 0; p < 4; ++p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.rec + c.lane * 16 + 32 * p));
      const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      s[p] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi)), ones);
    }
    return _mm256_add_epi32(acc, _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3])));
  }
};
using W4 = W4T<1>;   // w4a8: groups of 32
using W4G = W4T<4>;  // w4a8_g128: groups of 128

// w8a8: a row's 32 int8 codes in input order; |w| x sign(x, w) for maddubs (codes in -127..127:
// pairs at most 2 * 127 * 127 < 2^15), then six hadds and a lane swap put row r in lane r.
struct W8 : CodesInPlace {
  static constexpr int SUBS = 1, SUB = BLOCK * 32, REC = SUBS * SUB + BLOCK * 4, SCALE = SUBS * SUB;
  static constexpr bool MIN = false;
  using Int = __m256i;
  static inline __m256 scale(const uint8_t* rec, int lane) { return Vec::load(floats(rec, SCALE) + lane); }
  static inline __m256 min(const uint8_t*, int) { return Vec::zero(); }
  static inline Int first(int32_t) { return _mm256_setzero_si256(); }
  static inline __m256 to_float(Int acc) { return _mm256_cvtepi32_ps(acc); }
  static inline Int add(Int acc, const Codes& c, const int8_t* x) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), ones = _mm256_set1_epi16(1);
    __m256i s[8];
    for (int r = 0; r < 8; ++r) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.rec + (c.lane + r) * 32));
      s[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), ones);
    }
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31)));
  }
};

// One group of n (a multiple of 32) float activations -> int8 codes round(v * 127 / max|v|) (nearest even: the
// MXCSR default), returns max|v|: NaN when an input is NaN (nan_group; max_ps alone would drop it).
static inline float quantize_group(const float* v, int8_t* q, int32_t* sum, int n) {
  const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_and_ps(_mm256_loadu_ps(v), mag);
  __m256 nan = _mm256_cmp_ps(mx, mx, _CMP_UNORD_Q);
  for (int i = 8; i < n; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(v + i), mag);
    mx = _mm256_max_ps(mx, a), nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float amax = 0.0f;
  for (float l : lanes) amax = l > amax ? l : amax;
  if (_mm256_movemask_ps(nan)) return nan_group(q, sum, n);
  const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  alignas(32) int32_t c[128];  // n <= 128
  for (int i = 0; i < n; i += 8)
    _mm256_store_si256(reinterpret_cast<__m256i*>(c + i), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), id)));
  int32_t s = 0;
  for (int j = 0; j < n; ++j) q[j] = (int8_t)c[j], s += c[j];
  *sum = s;
  return amax;
}
