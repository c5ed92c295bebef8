// The per-head matmul of the absorbed decode and the SwiGLU elementwise op, one instruction set. Included once per ISA by
// decode_ops.cpp inside `namespace <isa>` under `#pragma GCC target(...)`; the loops are written
// for the auto-vectorizer. Nothing here may include a header (we are inside a namespace); exp_poly.h
// is included before this file in each namespace.
//
// acc[n, 0:C] = sum_k x[n, k] * w[k, 0:C] for rows n of one head, float32 accumulation in k order.
// Rows go four at a time (x is zero-padded to a multiple of 4 by the caller) and columns 64 at a
// time, so each widened weight row is used by four rows from L1. A row's bits depend only on its
// own x and w: never on how many rows share the call (batch invariance).

constexpr int ROWS = 4;
constexpr int COLS = 64;

template <typename W>
static inline void widen_cols(const W* __restrict src, float* __restrict dst, int n);

template <>
inline void widen_cols<float>(const float* __restrict src, float* __restrict dst, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) dst[i] = src[i];
}

template <>
inline void widen_cols<uint16_t>(const uint16_t* __restrict src, float* __restrict dst, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    uint32_t u = (uint32_t)src[i] << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    dst[i] = f;
  }
}

// x [R, K] float32 (R a multiple of ROWS), w [K, C] -> acc [R, C] float32.
template <typename W>
static void head_rows(const float* __restrict x, int R, int K, const W* __restrict w, int C, float* __restrict acc) {
  alignas(64) float wk[COLS];
  for (int r0 = 0; r0 < R; r0 += ROWS) {
    const float* x0 = x + (int64_t)r0 * K;
    const float *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
    for (int c0 = 0; c0 < C; c0 += COLS) {
      const int cw = C - c0 < COLS ? C - c0 : COLS;
      alignas(64) float a0[COLS] = {0}, a1[COLS] = {0}, a2[COLS] = {0}, a3[COLS] = {0};
      for (int i = cw; i < COLS; ++i) wk[i] = 0.0f;
      for (int k = 0; k < K; ++k) {
        widen_cols<W>(w + (int64_t)k * C + c0, wk, cw);
        const float v0 = x0[k], v1 = x1[k], v2 = x2[k], v3 = x3[k];
#pragma omp simd
        for (int i = 0; i < COLS; ++i) {
          a0[i] += v0 * wk[i];
          a1[i] += v1 * wk[i];
          a2[i] += v2 * wk[i];
          a3[i] += v3 * wk[i];
        }
      }
      float* o = acc + (int64_t)r0 * C + c0;
      for (int i = 0; i < cw; ++i) {
        o[i] = a0[i];
        o[C + i] = a1[i];
        o[2 * C + i] = a2[i];
        o[3 * C + i] = a3[i];
      }
    }
  }
}

static void head_rows_f32(const float* x, int R, int K, const float* w, int C, float* acc) {
  head_rows<float>(x, R, K, w, C, acc);
}

static void head_rows_bf16(const float* x, int R, int K, const uint16_t* w, int C, float* acc) {
  head_rows<uint16_t>(x, R, K, w, C, acc);
}

// SwiGLU's silu(gate) * up on rows [t0, t1) of gate_up [T, 2I] (float or bf16 bits), rounded to
// the activation dtype between the two ops as F.silu(gate) * up is. e^x by exp_poly (exp_poly.h in
// attention/csrc, the attention kernels' polynomial, ~2 ulp) so the loop vectorizes: a prefill
// chunk's [2048, 2I] took ~6 ns per element through libm's exp. Elementwise: a row's bits never
// depend on the batch.

// __builtin_bit_cast, not memcpy: the vectorizer sees through it
static inline float bf16_bits_to_float(uint16_t v) { return __builtin_bit_cast(float, (uint32_t)v << 16); }
static inline uint32_t float_to_bf16_bits(float f) {  // nearest even (finite values)
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
static inline float silu(float x) { return x / (1.0f + exp_poly(-x)); }

static void silu_mul_rows(const float* __restrict gate_up, float* __restrict out, int64_t t0, int64_t t1, int64_t I) {
  for (int64_t t = t0; t < t1; ++t) {
    const float *g = gate_up + t * 2 * I, *u = g + I;
    float* o = out + t * I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) o[i] = silu(g[i]) * u[i];
  }
}

static void silu_mul_rows(const uint16_t* __restrict gate_up, uint16_t* __restrict out, int64_t t0, int64_t t1,
                          int64_t I) {
  for (int64_t t = t0; t < t1; ++t) {
    const uint16_t *g = gate_up + t * 2 * I, *u = g + I;
    uint16_t* o = out + t * I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) {
      const float act = bf16_bits_to_float((uint16_t)float_to_bf16_bits(silu(bf16_bits_to_float(g[i]))));
      o[i] = (uint16_t)float_to_bf16_bits(act * bf16_bits_to_float(u[i]));
    }
  }
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
