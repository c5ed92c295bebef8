// isa_scalar's one lane for qlinear_impl.h (the same operations as the SIMD paths' lanes, so the same
// bits) and its blocking. Included inside `namespace isa_scalar` by qlinear_scalar.cpp, and by qlinear.cpp
// for the record sizes. Nothing here may include a header.
struct Vec {  // one lane: the same operations, so the same bits as the SIMD paths
  static constexpr int W = 1;
  using T = float;
  static inline T zero() { return 0.0f; }
  static inline T load(const float* p) { return *p; }
  static inline void store(float* p, T v) { *p = v; }
  static inline T set1(float v) { return v; }
  static inline T fma(T a, T b, T c) { return __builtin_fmaf(a, b, c); }
  static inline T mul(T a, T b) { return a * b; }
  static inline T add(T a, T b) { return a + b; }
  static inline T nibble(const int32_t* words, int t) {
    const uint32_t v = (uint32_t)*words;
    return (float)(int32_t)(t == 7 ? v >> 28 : v & (15u << 4 * t));
  }
  static inline T byte(const int8_t* p) { return (float)*p; }
  static inline T half(const uint16_t* p) { return half_to_float(*p); }
  static inline T bf16_lo(const int32_t* w) { return __builtin_bit_cast(float, (uint32_t)*w << 16); }
  static inline T bf16_hi(const int32_t* w) { return __builtin_bit_cast(float, (uint32_t)*w & 0xffff0000u); }
  static constexpr bool DPBF16 = false;
};
constexpr int TILE_MIN = 4, DIRECT_P = 16, DIRECT_MB = 3, TILE_BLOCKS = 1, TILE_P = 16, MB_TILE = 6;
