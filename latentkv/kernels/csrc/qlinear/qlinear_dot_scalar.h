// Integer-dot weight formats and the activations' quantizer, one row at a time, for
// qlinear_dot_impl.h: the scalar path every other is checked against (the same integer sums, the
// same float steps). Included by qlinear_scalar.cpp inside `namespace isa_scalar` after qlinear_impl.h.
// Nothing here may include a header.

struct W4 : CodesInPlace {  // the AVX2 layout (slot 2p / 2p + 1 of rows p, p + 4 in each half), one row at a time
  static constexpr int REC = BLOCK * 16 + 2 * BLOCK * 2, SCALE = BLOCK * 16;
  static constexpr bool MIN = true;
  static inline float scale(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + lane); }
  static inline float min(const uint8_t* rec, int lane) { return Vec::half(halves(rec, SCALE) + BLOCK + lane); }
  static inline float isum(const Codes& codes, const int8_t* x, int32_t) {
    const int r = codes.lane & 7;
    const uint8_t* c = codes.rec + ((codes.lane & 8) + 2 * (r & 3) + (r >> 2)) * 16;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += (c[j] & 15) * x[j] + (c[j] >> 4) * x[j + 16];
    return (float)s;
  }
};

struct W8 : CodesInPlace {
  static constexpr int REC = BLOCK * 32 + BLOCK * 4, SCALE = BLOCK * 32;
  static constexpr bool MIN = false;
  static inline float scale(const uint8_t* rec, int lane) { return Vec::load(floats(rec, SCALE) + lane); }
  static inline float min(const uint8_t*, int) { return 0.0f; }
  static inline float isum(const Codes& c, const int8_t* x, int32_t) {
    const int8_t* w = reinterpret_cast<const int8_t*>(c.rec) + c.lane * 32;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += w[j] * x[j];
    return (float)s;
  }
};

static inline float quantize_group(const float* v, int8_t* q, int32_t* sum) {
  float amax = 0.0f;
  bool nan = false;
  for (int j = 0; j < 32; ++j) amax = std::fabs(v[j]) > amax ? std::fabs(v[j]) : amax, nan |= std::isnan(v[j]);
  if (nan) return nan_group(q, sum);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t s = 0;
  for (int j = 0; j < 32; ++j) {
    const float y = v[j] * id;  // one rounding, as the SIMD paths' mul
    q[j] = (int8_t)std::nearbyint(y);
    s += q[j];
  }
  *sum = s;
  return amax;
}
