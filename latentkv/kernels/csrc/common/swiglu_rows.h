// SwiGLU's rows for every native kernel of latentkv that runs it (decode_ops' silu_mul, the MoE op
// in qlinear), so both give the same bits on the same ISA. Included inside each ISA's namespace
// under its `#pragma GCC target`, after exp_poly.h, so no include guard and no includes.
//
// silu(gate) * up on rows [t0, t1) of gate_up [T, 2I] (float or bf16 bits), rounded to
// the activation dtype between the two ops as F.silu(gate) * up is. e^x by exp_poly
// (common/exp_poly.h, the attention kernels' polynomial, ~2 ulp) so the loop vectorizes: a prefill
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
