// Integer-dot weight formats on AVX-512 VNNI for qlinear_dot_impl.h: vpdpbusd multiplies u8 by s8
// bytes and adds each four products into an int32 lane (exact: no saturation, no int16 step).
// Included by qlinear_avx512.cpp inside `namespace isa_avx512vnni` (isa_avx512's Vec: W = 16, so a panel is
// a whole 16-row record, lane 0). Nothing here may include a header.
//
// The records are pack_w4a8's / pack_w8a8's (kernels/qlinear.py), each row's codes in one run of
// bytes. `codes` transposes a record once per pass of activation rows into chunks of 4 inputs:
// vector c holds chunk c of rows 0..15 in lanes 0..15, so `isum` is one vpdpbusd per chunk against
// the chunk's 4 activation bytes broadcast to every lane, each lane accumulating its own row: no
// reduction across lanes, and the rows already in lane order (the float steps that follow are
// qlinear_dot_impl.h's, the same IEEE operations per output element as every path).
//   w4a8: nibbles unsigned, activations signed (as AVX2's maddubs takes them); chunk c of the low
//         nibbles meets inputs 4c..4c+3, of the high nibbles inputs 16 + 4c.. (pack_w4a8's bytes).
//   w8a8: the codes xor 0x80 (code + 128, 1..255) are the unsigned operand, so a lane's sum
//         exceeds the dot product by 128 * sum(q_x): the group's accumulator starts at -128 * sum(q_x)
//         (every partial sum under 2^21 in magnitude: exact; w8a8 stays on groups of 32).

// The 4 activation bytes at x in every lane: a broadcast load (vpdpbusd's embedded {1to16} broadcast
// instead, by inline asm, was no faster in an A/B on a shared Zen 4).
static inline __m512i quad(const int8_t* x) {
  int32_t v;
  __builtin_memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

template <int S>
struct W4T {
  static constexpr int SUBS = S;  // sub-blocks of 32 inputs a group
  static constexpr int SUB = isa_avx2::W4T<S>::SUB, REC = isa_avx2::W4T<S>::REC, SCALE = isa_avx2::W4T<S>::SCALE;
  static constexpr bool MIN = true;
  using Int = __m512i;
  static inline Int first(int32_t) { return _mm512_setzero_si512(); }
  static inline __m512 to_float(Int acc) { return _mm512_cvtepi32_ps(acc); }
  struct Codes {
    __m512i lo[4], hi[4];  // chunk c of the low / high nibbles, row r in lane r
  };
  static inline __m512 scale(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + lane); }
  static inline __m512 min(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + BLOCK + lane); }
  // 64 bytes hold 4 rows (slots 4q..4q+3 of a half, q = 0, 1; W4A8_SLOTS: slot s is row
  // (0, 4, 1, 5, 2, 6, 3, 7)[s]), one 128-bit lane each, chunk d in its dword d. Per half, vpermt2d
  // gathers rows 0..7 of chunks 0, 1 (then 2, 3) from the half's two vectors; 128-bit shuffles pair
  // the halves' 256-bit parts into rows 0..15 of one chunk.
  __attribute__((always_inline)) static inline Codes codes(const uint8_t* rec, int) {
    // lane i < 8: row i of chunk d, lane 8 + i: of chunk d + 1 (dword 4 * slot + d of the pair; + 16: the second vector)
    const __m512i pick = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
    const __m512i two = _mm512_set1_epi32(2), m4 = _mm512_set1_epi8(15);
    __m512i a[2], b[2];  // per half: chunks 0 | 1, 2 | 3
    for (int h = 0; h < 2; ++h) {
      const __m512i v0 = _mm512_loadu_si512(rec + 128 * h), v1 = _mm512_loadu_si512(rec + 128 * h + 64);
      a[h] = _mm512_permutex2var_epi32(v0, pick, v1);
      b[h] = _mm512_permutex2var_epi32(v0, _mm512_add_epi32(pick, two), v1);
    }
    const __m512i t[4] = {_mm512_shuffle_i64x2(a[0], a[1], 0x44), _mm512_shuffle_i64x2(a[0], a[1], 0xee),
                          _mm512_shuffle_i64x2(b[0], b[1], 0x44), _mm512_shuffle_i64x2(b[0], b[1], 0xee)};
    Codes c;
    for (int d = 0; d < 4; ++d)
      c.lo[d] = _mm512_and_si512(t[d], m4), c.hi[d] = _mm512_and_si512(_mm512_srli_epi16(t[d], 4), m4);
    return c;
  }
  // two chains (low, high nibbles) for the latency, one integer add: exact
  __attribute__((always_inline)) static inline Int add(Int acc, const Codes& c, const int8_t* x) {
    __m512i lo = acc, hi = _mm512_setzero_si512();
    for (int d = 0; d < 4; ++d)
      lo = _mm512_dpbusd_epi32(lo, c.lo[d], quad(x + 4 * d)), hi = _mm512_dpbusd_epi32(hi, c.hi[d], quad(x + 16 + 4 * d));
    return _mm512_add_epi32(lo, hi);
  }
};
using W4 = W4T<1>;   // w4a8: groups of 32
using W4G = W4T<4>;  // w4a8_g128: groups of 128

struct W8 {
  static constexpr int SUBS = 1, SUB = isa_avx2::W8::SUB, REC = isa_avx2::W8::REC, SCALE = isa_avx2::W8::SCALE;
  static constexpr bool MIN = false;
  using Int = __m512i;
  static inline Int first(int32_t xsum) { return _mm512_set1_epi32(-128 * xsum); }  // the bias of the group's codes
  static inline __m512 to_float(Int acc) { return _mm512_cvtepi32_ps(acc); }
  struct Codes {
    __m512i q[8];  // chunk c of the codes + 128, row r in lane r
  };
  static inline __m512 scale(const uint8_t* rec, int lane) { return Vec::load(floats(rec, SCALE) + lane); }
  static inline __m512 min(const uint8_t*, int) { return Vec::zero(); }
  // 64 bytes hold rows 2i, 2i + 1 (dwords 0..7: chunks 0..7 of row 2i). A 16 x 8 dword transpose
  // in three rounds of vpermt2d, each exchanging one bit of the vector number (row bits) for one of
  // the lane number (chunk bits): (rows 4a.. of chunks 4k..) -> (rows 8b.. of chunks 4k + 2l..) ->
  // (rows 0..15 of chunk 4k + 2l + m).
  __attribute__((always_inline)) static inline Codes codes(const uint8_t* rec, int) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    // lane (r1 r0 c1 c0): row r1 r0, chunk c1 c0 of the pair -> dword 8 r0 + c1 c0 of vector r1 (+ 4: chunks 4..7)
    const __m512i p1 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    // lane (r2 r1 r0 c0) -> lane (r1 r0 l c0) of vector r2 (+ 2: l = 1)
    const __m512i p2 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    // lane (r3 r2 r1 r0) -> lane (r2 r1 r0 m) of vector r3 (+ 1: m = 1)
    const __m512i p3 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i four = _mm512_set1_epi32(4), two = _mm512_set1_epi32(2), one = _mm512_set1_epi32(1);
    __m512i v[8], u[8], w[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm512_xor_si512(_mm512_loadu_si512(rec + 64 * i), flip);
    for (int a = 0; a < 4; ++a)  // u[2a + k]: rows 4a..4a+3, chunks 4k..4k+3
      u[2 * a] = _mm512_permutex2var_epi32(v[2 * a], p1, v[2 * a + 1]),
      u[2 * a + 1] = _mm512_permutex2var_epi32(v[2 * a], _mm512_add_epi32(p1, four), v[2 * a + 1]);
    for (int b = 0; b < 2; ++b)  // w[4b + 2k + l]: rows 8b..8b+7, chunks 4k + 2l, 4k + 2l + 1
      for (int k = 0; k < 2; ++k)
        w[4 * b + 2 * k] = _mm512_permutex2var_epi32(u[4 * b + k], p2, u[4 * b + 2 + k]),
        w[4 * b + 2 * k + 1] = _mm512_permutex2var_epi32(u[4 * b + k], _mm512_add_epi32(p2, two), u[4 * b + 2 + k]);
    Codes c;
    for (int j = 0; j < 4; ++j)  // chunk 2j + m: j = 2k + l
      c.q[2 * j] = _mm512_permutex2var_epi32(w[j], p3, w[4 + j]),
      c.q[2 * j + 1] = _mm512_permutex2var_epi32(w[j], _mm512_add_epi32(p3, one), w[4 + j]);
    return c;
  }
  // two chains (even, odd chunks) for the latency, one integer add: exact
  __attribute__((always_inline)) static inline Int add(Int acc, const Codes& c, const int8_t* x) {
    __m512i even = acc, odd = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j)
      even = _mm512_dpbusd_epi32(even, c.q[2 * j], quad(x + 8 * j)),
      odd = _mm512_dpbusd_epi32(odd, c.q[2 * j + 1], quad(x + 8 * j + 4));
    return _mm512_add_epi32(even, odd);
  }
};
