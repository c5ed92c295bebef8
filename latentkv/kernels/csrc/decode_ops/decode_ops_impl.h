// The per-head matmul of the absorbed decode and the RMSNorm rows, one instruction set. Included once per ISA by
// decode_ops_<isa>.cpp inside `namespace <isa>` under `#pragma GCC target(...)`, after that namespace's
// HEAD_W (float lanes) and HEAD_NV4 (vectors per 4-row tile); the other loops are written for the
// auto-vectorizer. Nothing here may include a header (we are inside a namespace); exp_poly.h and
// swiglu_rows.h (SwiGLU's rows and the bf16 bit helpers the RMSNorm rows use) are included before
// this file in each namespace.
//
// acc[n, 0:C] = sum_k x[n, k] * w[k, 0:C] for rows n of one head, float32 accumulation in k order.
// Accumulators live in registers: tiles of 4 rows x NV4 vectors (then single rows x 4 vectors) of
// HEAD_W lanes (set by the includer per ISA; GCC vector types), so each weight vector loaded is
// used by every row of the tile and no accumulator spills (AVX2 has 16 registers: 4 x 2 there).
// Every output element is acc = x[0] w[0] + x[1] w[1] + ... in k order with the same instruction
// (contracted to an FMA where the ISA has one) in every tile and in the padded last vector, so a
// row's bits depend only on its own x and w: never on how many rows share the call or which tile
// took it (batch invariance).

typedef float HVec __attribute__((vector_size(HEAD_W * 4)));
typedef uint16_t HVec16 __attribute__((vector_size(HEAD_W * 2)));
typedef uint32_t HVecU __attribute__((vector_size(HEAD_W * 4)));

static inline HVec hload(const float* p) {
  HVec v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
static inline HVec hload(const uint16_t* p) {  // bf16 bits widened: exact
  HVec16 h;
  __builtin_memcpy(&h, p, sizeof h);
  return (HVec)(__builtin_convertvector(h, HVecU) << 16);
}
static inline float hwiden(float v) { return v; }
static inline float hwiden(uint16_t v) { return __builtin_bit_cast(float, (uint32_t)v << 16); }

// RT rows of x [*, K] times NV vectors of columns from c0 of w [K, C] -> acc [RT rows, stride C].
template <int RT, int NV, typename W>
static inline void head_tile(const float* __restrict x, int K, const W* __restrict w, int C, int c0,
                             float* __restrict acc) {
  HVec a[RT][NV] = {};
  for (int k = 0; k < K; ++k) {
    const W* wk = w + (int64_t)k * C + c0;
    HVec wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = hload(wk + j * HEAD_W);
    for (int r = 0; r < RT; ++r) {
      const float xv = x[(int64_t)r * K + k];
      for (int j = 0; j < NV; ++j) a[r][j] += xv * wv[j];
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < NV; ++j) __builtin_memcpy(acc + (int64_t)r * C + c0 + j * HEAD_W, &a[r][j], sizeof(HVec));
}

// RT rows over all columns: NV-vector tiles, then tiles of NV/2, NV/4 ... 1 vectors, then the last
// C % HEAD_W columns in a zero-padded vector. Wide tiles matter for single rows: each k reads NV
// contiguous vectors of w (a row of w is C apart) and keeps NV independent FMA chains in flight.
template <int RT, int NV, typename W>
static inline void head_row_tile(const float* __restrict x, int K, const W* __restrict w, int C, float* __restrict acc) {
  const int full = C / HEAD_W * HEAD_W;
  int c0 = 0;
  for (; c0 + NV * HEAD_W <= full; c0 += NV * HEAD_W) head_tile<RT, NV>(x, K, w, C, c0, acc);
  if constexpr (NV >= 8) if (c0 + 4 * HEAD_W <= full) head_tile<RT, 4>(x, K, w, C, c0, acc), c0 += 4 * HEAD_W;
  if constexpr (NV >= 4) if (c0 + 2 * HEAD_W <= full) head_tile<RT, 2>(x, K, w, C, c0, acc), c0 += 2 * HEAD_W;
  for (; c0 < full; c0 += HEAD_W) head_tile<RT, 1>(x, K, w, C, c0, acc);
  const int tail = C - full;
  if (tail == 0) return;
  // The last C % HEAD_W columns in one zero-padded vector, so they take the same vector FMA as
  // every other column: whether a scalar loop is contracted is the compiler's choice, and GCC
  // chose differently for float and bf16 weights.
  HVec a[RT] = {};
  for (int k = 0; k < K; ++k) {
    HVec wv = {};
    for (int l = 0; l < tail; ++l) wv[l] = hwiden(w[(int64_t)k * C + full + l]);
    for (int r = 0; r < RT; ++r) a[r] += x[(int64_t)r * K + k] * wv;
  }
  for (int r = 0; r < RT; ++r)
    for (int l = 0; l < tail; ++l) acc[(int64_t)r * C + full + l] = a[r][l];
}

// x [R, K] float32, w [K, C] -> acc [R, C] float32.
template <typename W>
static void head_rows(const float* __restrict x, int R, int K, const W* __restrict w, int C, float* __restrict acc) {
  int r0 = 0;
  for (; r0 + 4 <= R; r0 += 4) head_row_tile<4, HEAD_NV4>(x + (int64_t)r0 * K, K, w, C, acc + (int64_t)r0 * C);
  for (; r0 < R; ++r0) head_row_tile<1, HEAD_NV1>(x + (int64_t)r0 * K, K, w, C, acc + (int64_t)r0 * C);
}

static void head_rows_f32(const float* x, int R, int K, const float* w, int C, float* acc) {
  head_rows<float>(x, R, K, w, C, acc);
}

static void head_rows_bf16(const float* x, int R, int K, const uint16_t* w, int C, float* acc) {
  head_rows<uint16_t>(x, R, K, w, C, acc);
}

// One bf16 output row of head_matmul: o[c] = bf16(acc[c] * s) for c < C, then o[C + e] = bf16(extra[e] * s)
// (extra contiguous bf16), rounded to nearest even as torch rounds (a NaN to its quiet NaN).
static inline uint16_t bf16_round_nan(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0u : (uint16_t)float_to_bf16_bits(f);
}
static void head_out_bf16(const float* __restrict acc, int64_t C, const uint16_t* __restrict extra, int64_t E, float s,
                          uint16_t* __restrict o) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) o[c] = bf16_round_nan(acc[c] * s);
#pragma omp simd
  for (int64_t e = 0; e < E; ++e) o[C + e] = bf16_round_nan(bf16_bits_to_float(extra[e]) * s);
}

// RMSNorm of rows [t0, t1) of x [T, d] (float or bf16 bits, the weight the same type), with the
// residual added first when res is given (sum = x + res, rounded to the activation dtype as
// x + h is): float32 statistics, x * rsqrt(mean(x^2) + eps) * weight, one rounding. The loops
// vectorize (a row's sum of squares in a fixed lane order: the same for every row and batch).
static inline float widen_any(float v) { return v; }
static inline float widen_any(uint16_t v) { return bf16_bits_to_float(v); }
static inline float round_any(float f, const float*) { return f; }
static inline uint16_t round_any(float f, const uint16_t*) { return (uint16_t)float_to_bf16_bits(f); }

template <typename T>
static void rms_norm_rows(const T* __restrict x, const T* __restrict res, T* __restrict sum, const T* __restrict w,
                          float eps, T* __restrict out, int64_t t0, int64_t t1, int64_t d, float* __restrict row) {
  for (int64_t t = t0; t < t1; ++t) {
    const T* xr = x + t * d;
    float ss = 0.0f;
    if (res) {
      const T* rr = res + t * d;
      T* sr = sum + t * d;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < d; ++i) {
        const T s = round_any(widen_any(xr[i]) + widen_any(rr[i]), xr);
        sr[i] = s;
        const float v = widen_any(s);
        row[i] = v;
        ss += v * v;
      }
    } else {
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < d; ++i) {
        const float v = widen_any(xr[i]);
        row[i] = v;
        ss += v * v;
      }
    }
    const float rs = 1.0f / __builtin_sqrtf(ss / (float)d + eps);
    T* o = out + t * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = round_any(row[i] * rs * widen_any(w[i]), o);
  }
}

static void rms_norm_rows_f32(const float* x, const float* res, float* sum, const float* w, float eps, float* out,
                              int64_t t0, int64_t t1, int64_t d, float* row) {
  rms_norm_rows<float>(x, res, sum, w, eps, out, t0, t1, d, row);
}

static void rms_norm_rows_bf16(const uint16_t* x, const uint16_t* res, uint16_t* sum, const uint16_t* w, float eps,
                               uint16_t* out, int64_t t0, int64_t t1, int64_t d, float* row) {
  rms_norm_rows<uint16_t>(x, res, sum, w, eps, out, t0, t1, d, row);
}

// rope's and write_latent's rows, contiguous values. Not contracted into FMAs (optimize attribute):
// each product and sum rounds once, as on the scalar path (built without FMA) and in model/rope.py,
// so every ISA stores the same bits (tests/kernels/test_decode_ops.py checks them against the scalar path).
template <typename T>
__attribute__((optimize("fp-contract=off"))) static void rotate_vals(const T* __restrict x, int64_t d,
                                                                     const float* __restrict cs,
                                                                     const float* __restrict sn, bool interleaved,
                                                                     float* __restrict out) {
  const int64_t half = d / 2;
  if (interleaved) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = widen_any(x[2 * i]), b = widen_any(x[2 * i + 1]);
      out[2 * i] = a * cs[i] - b * sn[i];
      out[2 * i + 1] = b * cs[i] + a * sn[i];
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = widen_any(x[i]), b = widen_any(x[i + half]);
      out[i] = a * cs[i] - b * sn[i];
      out[i + half] = b * cs[i] + a * sn[i];
    }
  }
}
static void rotate_vals_f32(const float* x, int64_t d, const float* cs, const float* sn, bool interleaved, float* out) {
  rotate_vals<float>(x, d, cs, sn, interleaved, out);
}
static void rotate_vals_bf16(const uint16_t* x, int64_t d, const float* cs, const float* sn, bool interleaved, float* out) {
  rotate_vals<uint16_t>(x, d, cs, sn, interleaved, out);
}

// x [n] float -> bf16 bits, nearest even (a NaN to its quiet NaN), as c10::BFloat16(float); with
// `back`, x itself becomes those values again (the rotated key rounded to the activation dtype).
static void round_vals_bf16(float* __restrict x, int64_t n, uint16_t* __restrict out, bool back) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = bf16_round_nan(x[i]);
    if (out) out[i] = h;
    if (back) x[i] = bf16_bits_to_float(h);
  }
}

// max |x[i]| (a NaN never wins, as std::max(top, |x|) in the scalar loop) and the int8 codes of x / s,
// rounded to nearest even and clamped to +-127, as cache/latent_cache.py quantize_latent.
template <typename T>
static float absmax_vals(const T* __restrict x, int64_t n) {
  float top = 0.0f;
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < n; ++i) {
    const float v = __builtin_fabsf(widen_any(x[i]));
    top = top < v ? v : top;
  }
  return top;
}
static float absmax_f32(const float* x, int64_t n) { return absmax_vals<float>(x, n); }
static float absmax_bf16(const uint16_t* x, int64_t n) { return absmax_vals<uint16_t>(x, n); }

template <typename T>
static void quantize_vals(const T* __restrict x, int64_t n, float s, int8_t* __restrict out) {
  const float magic = 12582912.0f;  // 1.5 x 2^23: adding and subtracting it rounds to an integer, ties to even
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = (widen_any(x[i]) / s + magic) - magic;
    v = -127.0f < v ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    out[i] = (int8_t)v;
  }
}
static void quantize_f32(const float* x, int64_t n, float s, int8_t* out) { quantize_vals<float>(x, n, s, out); }
static void quantize_bf16(const uint16_t* x, int64_t n, float s, int8_t* out) { quantize_vals<uint16_t>(x, n, s, out); }
