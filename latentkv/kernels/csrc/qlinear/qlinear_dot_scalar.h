// Integer-dot weight formats and the activations' quantizer, one row at a time, for
// qlinear_dot_impl.h: the scalar path every other is checked against (the same integer sums, the
// same float steps). Included by qlinear_scalar.cpp inside `namespace isa_scalar` after qlinear_impl.h.
// Nothing here may include a header.

template <int S>
struct W4T : CodesInPlace {  // the AVX2 layout (slot 2p / 2p + 1 of rows p, p + 4 in each half), one row at a time
  static constexpr int SUBS = S;  // sub-blocks of 32 inputs a group
  static constexpr int SUB = BLOCK * 16, REC = SUBS * SUB + 2 * BLOCK * 2, SCALE = SUBS * SUB;
  static constexpr bool MIN = true;
  using Int = int32_t;
  static inline float scale(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + lane); }
  static inline float min(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + BLOCK + lane); }
  static inline Int first(int32_t) { return 0; }
  static inline Int add(Int acc, const Codes& codes, const int8_t* x) {
    const int r = codes.lane & 7;
    const uint8_t* c = codes.rec + ((codes.lane & 8) + 2 * (r & 3) + (r >> 2)) * 16;
    for (int j = 0; j < 16; ++j) acc += (c[j] & 15) * x[j] + (c[j] >> 4) * x[j + 16];
    return acc;
  }
  static inline float to_float(Int acc) { return (float)acc; }
};
using W4 = W4T<1>;   // w4a8: groups of 32
using W4G = W4T<4>;  // w4a8_g128: groups of 128

struct W8 : CodesInPlace {
  static constexpr int SUBS = 1, SUB = BLOCK * 32, REC = SUBS * SUB + BLOCK * 4, SCALE = SUBS * SUB;
  static constexpr bool MIN = false;
  using Int = int32_t;
  static inline float scale(const uint8_t* rec, int lane) { return Vec::load(floats(rec, SCALE) + lane); }
  static inline float min(const uint8_t*, int) { return 0.0f; }
  static inline Int first(int32_t) { return 0; }
  static inline Int add(Int acc, const Codes& c, const int8_t* x) {
    const int8_t* w = reinterpret_cast<const int8_t*>(c.rec) + c.lane * 32;
    for (int j = 0; j < 32; ++j) acc += w[j] * x[j];
    return acc;
  }
  static inline float to_float(Int acc) { return (float)acc; }
};

static inline float quantize_group(const float* v, int8_t* q, int32_t* sum, int n) {
  float amax = 0.0f;
  bool nan = false;
  for (int j = 0; j < n; ++j) amax = std::fabs(v[j]) > amax ? std::fabs(v[j]) : amax, nan |= std::isnan(v[j]);
  if (nan) return nan_group(q, sum, n);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t s = 0;
  for (int j = 0; j < n; ++j) {
    const float y = v[j] * id;  // one rounding, as the SIMD paths' mul
    q[j] = (int8_t)std::nearbyint(y);
    s += q[j];
  }
  *sum = s;
  return amax;
}
