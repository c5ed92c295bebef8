// e^x for every native kernel of latentkv (softmax, silu): one polynomial, ~2 ulp, no libm call. (The
// AMX prefill's softmax alone takes 2^x by vscalefps instead: mla_prefill_amx.h exp2_poly.)
// Included inside each ISA's namespace (`namespace isa_avx2 { #include "exp_poly.h" ... }`) under
// its `#pragma GCC target`, before the kernels that call it, so no include guard and no includes.
//
// exp_poly(float) is written for the auto-vectorizer (`#pragma omp simd` loops); exp_poly(V) takes a
// GCC vector of floats (__m256, __m512 or the kernels' own vector types) with the same arithmetic,
// so a lane's bits equal the scalar's on the same ISA (same fma contraction).
// The input is clamped to [-87, 88]: e^-87 ~ 1.6e-38 stays a normal float and the -inf of an
// empty softmax row gives that instead of a NaN (its weight is then 0 or masked by the caller).

template <typename F, typename U>  // F: float or a float vector; U: uint32 of the same shape
static inline F exp_poly_impl(F x) {
  const F lo = F{} - 87.0f, hi = F{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (floorf would keep a vectorized loop scalar);
  // t's low mantissa bits then hold n, so 2^n is one integer add and shift away.
  const F t = x * 1.44269504088896341f + 12582912.0f;
  const F n = t - 12582912.0f;
  const F r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln 2, ln 2 in two parts
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const U e = (__builtin_bit_cast(U, t) - (0x4B400000u - 127u)) << 23;  // bits of 2^n: n + 127 as the exponent
  return p * __builtin_bit_cast(F, e);
}

static inline float exp_poly(float x) { return exp_poly_impl<float, uint32_t>(x); }

template <typename V>
static inline V exp_poly(V x) {
  typedef uint32_t U __attribute__((vector_size(sizeof(V))));
  return exp_poly_impl<V, U>(x);
}
