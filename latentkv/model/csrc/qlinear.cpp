// latentkv weight-only quantized linears (CPU): y [M, N] = x [M, K] · Wᵀ with W stored as group-32
// int4 (scale + zero per group), int8 (scale per row) or plain float32 (the batch-invariant float32
// linear), packed by latentkv/model/qlinear.py (layout:
// qlinear_impl.h). Activations float32 or bfloat16 (widened to float32 once), float32 accumulation
// in a fixed order per output element: batch-invariant. Threads (at::parallel_for, torch's) split
// the output rows, never K.
//   linear(x [M, K], packed int32 [NB, G, REC], kind 4|8|32, N, isa) -> y [M, N] in x's dtype.
#include "torch_lite.h"

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include "cpu_isa.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace isa_avx512 {
struct Vec {
  static constexpr int W = 16;
  using T = __m512;
  static inline T zero() { return _mm512_setzero_ps(); }
  static inline T load(const float* p) { return _mm512_loadu_ps(p); }
  static inline void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static inline T set1(float v) { return _mm512_set1_ps(v); }
  static inline T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  // nibble t (bits 4t..4t+3) of each lane's word in place, q * 16^t (t = 7: shifted down, q)
  static inline T nibble(const int32_t* words, int t) {
    const __m512i v = _mm512_loadu_si512(words);
    return _mm512_cvtepi32_ps(t == 7 ? _mm512_srli_epi32(v, 28) : _mm512_and_si512(v, _mm512_set1_epi32(15 << 4 * t)));
  }
  static inline T byte(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};
constexpr int TILE_MIN = 4, DIRECT_P = 4, TILE_BLOCKS = 2;
#include "qlinear_impl.h"
}  // namespace isa_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
struct Vec {
  static constexpr int W = 8;
  using T = __m256;
  static inline T zero() { return _mm256_setzero_ps(); }
  static inline T load(const float* p) { return _mm256_loadu_ps(p); }
  static inline void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static inline T set1(float v) { return _mm256_set1_ps(v); }
  static inline T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static inline T nibble(const int32_t* words, int t) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
    return _mm256_cvtepi32_ps(t == 7 ? _mm256_srli_epi32(v, 28) : _mm256_and_si256(v, _mm256_set1_epi32(15 << 4 * t)));
  }
  static inline T byte(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};
constexpr int TILE_MIN = 4, DIRECT_P = 4, TILE_BLOCKS = 1;
#include "qlinear_impl.h"
}  // namespace isa_avx2
#pragma GCC pop_options

namespace isa_scalar {
struct Vec {  // one lane: the same operations, so the same bits as the SIMD paths
  static constexpr int W = 1;
  using T = float;
  static inline T zero() { return 0.0f; }
  static inline T load(const float* p) { return *p; }
  static inline void store(float* p, T v) { *p = v; }
  static inline T set1(float v) { return v; }
  static inline T fma(T a, T b, T c) { return __builtin_fmaf(a, b, c); }
  static inline T nibble(const int32_t* words, int t) {
    const uint32_t v = (uint32_t)*words;
    return (float)(int32_t)(t == 7 ? v >> 28 : v & (15u << 4 * t));
  }
  static inline T byte(const int8_t* p) { return (float)*p; }
};
constexpr int TILE_MIN = 4, DIRECT_P = 16, TILE_BLOCKS = 1;
#include "qlinear_impl.h"
}  // namespace isa_scalar

namespace {

constexpr float kInvPow16[7] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f};

using Linear = void (*)(const int32_t*, int64_t, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t,
                        int64_t);

// kind: 4 (int4), 8 (int8), 32 (float32 weights)
Linear pick(int64_t isa, int64_t kind) {
  if (isa == 2)
    return kind == 4 ? isa_avx512::linear<isa_avx512::Int4> : kind == 8 ? isa_avx512::linear<isa_avx512::Int8>
                                                                        : isa_avx512::linear<isa_avx512::F32>;
  if (isa == 1)
    return kind == 4 ? isa_avx2::linear<isa_avx2::Int4> : kind == 8 ? isa_avx2::linear<isa_avx2::Int8>
                                                                    : isa_avx2::linear<isa_avx2::F32>;
  return kind == 4 ? isa_scalar::linear<isa_scalar::Int4> : kind == 8 ? isa_scalar::linear<isa_scalar::Int8>
                                                                      : isa_scalar::linear<isa_scalar::F32>;
}

}  // namespace

std::vector<int64_t> supported_isas() { return isas_up_to(2); }

at::Tensor linear(at::Tensor x, at::Tensor packed, int64_t kind, int64_t N, int64_t isa) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "qlinear: CPU tensors only");
  TORCH_CHECK(isa_supported(isa), "qlinear: this CPU does not support instruction set ", isa);
  TORCH_CHECK(kind == 4 || kind == 8 || kind == 32, "qlinear: kind must be 4, 8 or 32");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "qlinear: x must be [M, K] float32 or bfloat16");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kInt && packed.is_contiguous(),
              "qlinear: packed must be contiguous int32 [NB, G, REC]");
  const int64_t M = x.size(0), K = x.size(1), NB = packed.size(0), G = packed.size(1), Kp = G * 32;
  const int64_t rec = kind == 4 ? isa_scalar::Int4::REC : kind == 8 ? isa_scalar::Int8::REC : isa_scalar::F32::REC;
  TORCH_CHECK(packed.size(2) == rec && NB % 4 == 0 && N <= NB * 16 && N > NB * 16 - 64 && K <= Kp && K > Kp - 32,
              "qlinear: packed weight [", NB, ", ", G, ", ", packed.size(2), "] does not fit x [", M, ", ", K, "], N ", N);
  const bool f32 = x.scalar_type() == at::kFloat;
  auto out = at::empty({M, N}, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return f32 ? out : out.to(x.scalar_type());
  // x as float32 rows of Kp (zeros past K) unless it already is one
  at::Tensor xf = x;
  if (!f32 || K != Kp || x.stride(1) != 1 || x.stride(0) < Kp) {
    xf = at::empty({M, Kp}, x.options().dtype(at::kFloat));
    float* dst = xf.data_ptr<float>();
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "qlinear_x", [&] {
      const scalar_t* src = x.data_ptr<scalar_t>();
      const int64_t s0 = x.stride(0), s1 = x.stride(1);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < Kp; ++k) dst[m * Kp + k] = k < K ? (float)src[m * s0 + k * s1] : 0.0f;
    });
  }
  const float* xp = xf.data_ptr<float>();
  int64_t ldx = xf.stride(0);
  // int4: each row's sum per group (in input order: a fixed order per row) for the min term, and
  // x' = x * 16^-(k % 8) (k % 8 < 7) for the in-place nibbles (qlinear_impl.h)
  std::vector<float> xsum(kind == 4 ? M * G : 1), xs(kind == 4 ? M * Kp : 0);
  if (kind == 4) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t g = 0; g < G; ++g) {
        float s = 0.0f;
        for (int64_t k = 0; k < 32; ++k) {
          const float v = xp[m * ldx + g * 32 + k];
          s += v;
          xs[m * Kp + g * 32 + k] = (k & 7) == 7 ? v : v * kInvPow16[k & 7];
        }
        xsum[m * G + g] = s;
      }
    xp = xs.data(), ldx = Kp;
  }
  pick(isa, kind)(packed.data_ptr<int32_t>(), NB, G, xp, M, ldx, xsum.data(), out.data_ptr<float>(), N, N);
  return f32 ? out : out.to(x.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, "int4 / int8 / float32 linear over a packed weight (see qlinear_impl.h)");
  m.def("supported_isas", &supported_isas, "instruction sets this CPU runs: 0 scalar, 1 avx2+fma, 2 avx512");
  // for the decode plan (model/csrc/decode_step.h), which calls `linear` without Python between
  m.attr("linear_capsule") = py::capsule(reinterpret_cast<void*>(&linear), "latentkv.qlinear.linear");
}
