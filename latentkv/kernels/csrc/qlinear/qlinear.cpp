// latentkv weight-only quantized linears (CPU): y [M, N] = x [M, K] · Wᵀ with W stored as group-32
// int4 (scale + zero per group), int8 (scale per row) or plain bf16 / float32 (the batch-invariant
// linears), packed by latentkv/kernels/qlinear.py (layout:
// qlinear_impl.h). Activations float32 or bfloat16 (widened to float32 once), float32 accumulation
// in a fixed order per output element: batch-invariant. Threads (at::parallel_for, torch's) split
// the output rows, never K.
//   linear(x [M, K], packed int32 [NB, G, REC], kind 4|8|16|32, N, isa) -> y [M, N] in x's dtype.
// And the integer-dot linears (qlinear_dot_impl.h): activations quantized to int8 per row and
// group of 32, int4 (w4a8: kind 104) or int8 (w8a8: kind 108) weights, AVX-512 VNNI vpdpbusd /
// AVX2 maddubs / scalar, through the same entry (so the decode plan's capsule runs them too).
// And a MoE layer's experts in one call (moe.h), over the same kernels as work units (qlinear_kernel.h).
// This file holds the ISA namespaces; the entries follow them.
#include "kernel_fns.h"
#include "torch_lite.h"

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include "cpu_isa.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <string>
#include <vector>

// A record's scales (and mins) at byte offset `at`: float16 (w4a8) or float32 (w8a8).
static inline const uint16_t* halves(const uint8_t* rec, int at) { return reinterpret_cast<const uint16_t*>(rec + at); }
static inline const float* floats(const uint8_t* rec, int at) { return reinterpret_cast<const float*>(rec + at); }

// The integer-dot formats that read a record's codes where they lie (qlinear_dot_impl.h's Codes):
// isum gets the record and the first of its rows.
struct CodesInPlace {
  struct Codes {
    const uint8_t* rec;
    int lane;
  };
  static inline Codes codes(const uint8_t* rec, int lane) { return {rec, lane}; }
};

// IEEE half -> float, exact (the scalar path's twin of vcvtph2ps): subnormals as mantissa * 2^-24.
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return sign ? -(float)man * 0x1p-24f : (float)man * 0x1p-24f;
  const uint32_t bits = exp == 31 ? 0x7f800000u | man << 13 : (exp + 112) << 23 | man << 13;
  return __builtin_bit_cast(float, sign | bits);
}

// quantize_group's answer (every ISA) for a group holding a NaN: codes 0, sum 0, max|v| NaN, so
// d_x and s_x are NaN and the NaN reaches every output of the row, as in a float linear.
static inline float nan_group(int8_t* q, int32_t* sum) {
  for (int j = 0; j < 32; ++j) q[j] = 0;
  *sum = 0;
  return __builtin_nanf("");
}

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
  static inline T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static inline T add(T a, T b) { return _mm512_add_ps(a, b); }
  // nibble t (bits 4t..4t+3) of each lane's word in place, q * 16^t (t = 7: shifted down, q)
  static inline T nibble(const int32_t* words, int t) {
    const __m512i v = _mm512_loadu_si512(words);
    return _mm512_cvtepi32_ps(t == 7 ? _mm512_srli_epi32(v, 28) : _mm512_and_si512(v, _mm512_set1_epi32(15 << 4 * t)));
  }
  static inline T byte(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static inline T half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  // words of two bf16 (input k in the low half, k + 1 in the high), one of them widened: exact
  static inline T bf16_lo(const int32_t* w) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(w), 16)); }
  static inline T bf16_hi(const int32_t* w) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(w), _mm512_set1_epi32((int)0xffff0000u)));
  }
  static constexpr bool DPBF16 = false;
};
constexpr int TILE_MIN = 4, DIRECT_P = 4, TILE_BLOCKS = 2, TILE_P = 2, MB_TILE = 6;
#include "qlinear_impl.h"
#include "exp_poly.h"     // common/: e^x (SwiGLU's)
#include "swiglu_rows.h"  // common/: SwiGLU's rows (the MoE op's; decode_ops' silu_mul runs the same)
}  // namespace isa_avx512
#pragma GCC pop_options

// AVX-512 with bf16 dot products: the avx512 loops, but bf16 weights times bf16 activations by
// vdpbf16ps (a pair of inputs per instruction: twice the FMA path's multiply-adds) in its own
// fixed order (pairs in input order): qlinear_impl.h's group_sums branches on Vec::DPBF16.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
namespace isa_avx512bf16 {
struct Vec : isa_avx512::Vec {
  static constexpr bool DPBF16 = true;
  static inline T words(const int32_t* w) { return _mm512_loadu_ps(reinterpret_cast<const float*>(w)); }
  // one word of x's pairs (two bf16 inputs) in every lane
  static inline T pair(const float* x) { return _mm512_set1_ps(*x); }
  static inline T dp(T w, T x, T acc) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
};
// 4 blocks x 6 rows: 24 accumulators of 32 registers (each weight vector feeds 6 rows, each x pair 4 panels)
constexpr int TILE_MIN = 4, DIRECT_P = 4, TILE_BLOCKS = 4, TILE_P = 4, MB_TILE = 6;
#include "qlinear_impl.h"
}  // namespace isa_avx512bf16
#pragma GCC pop_options

// AMX: bf16 weights times bf16 activations on the tile unit. A pack_bf16 record's [16 pairs][16 rows]
// words are one B tile of TDPBF16PS as they lie (64-byte rows), and a bf16 row's 32 inputs of a group
// one A tile row, so the kernel reads both without repacking. Each output element accumulates in its
// C tile group after group (one TDPBF16PS per group: 16 pairs in the unit's own fixed order), rows
// are independent lanes of the unit and always padded to whole 16-row tiles, and threads split the
// output columns: a row's bits are the same whatever M, its place in a tile or the threads, so the
// decode rows (M = 1) and a prompt's rows run one product. Not the avx512_bf16 path's bits (its own
// order): a process serves one ISA, and the self-check holds it to the scalar path's rounding.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
namespace isa_amx {
#include "amx_tiles.h"
// pack_bf16's record and the padded-row helper: qlinear_impl.h's, as the avx512 namespace has them
using isa_avx512::BLOCK, isa_avx512::GROUP, isa_avx512::align64;
constexpr int REC = isa_avx512::BF16::REC;
constexpr int64_t X_BLOCK_BYTES = 1 << 19;  // activation rows per M chunk: about this many bytes (of 2 MB L2: 256 KB-512 KB measured best)
constexpr int64_t KC = 8;  // groups per k block

// Tiles (amx_configure): 0-3 C (rows 16·i, columns 16·j at tile 2i + j), 4-5 A (two 16-row
// blocks), 6-7 B (two 16-column blocks).

// C tiles for two 16-row tiles (a0, and a1 when TWO: pair words, rows stride lda words, zeros past
// K) times blocks b0, b1 over groups g0 .. g1: started from zero (first k block) or from y (their
// running totals, float32: exact), stored back to y [32 rows, ldy]. Loads interleaved with the products that need them.
template <bool TWO>
static inline void tile_pair(const int32_t* packed, int64_t G, int64_t b0, int64_t b1, int64_t g0, int64_t g1,
                             const int32_t* a0, int64_t lda0, const int32_t* a1, int64_t lda1, float* y, int64_t ldy) {
  const int64_t sy = ldy * 4;
  if (g0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (TWO) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, y, sy);
    _tile_loadd(1, y + 16, sy);
    if constexpr (TWO) {
      _tile_loadd(2, y + 16 * ldy, sy);
      _tile_loadd(3, y + 16 * ldy + 16, sy);
    }
  }
  const int32_t* w0 = packed + b0 * G * REC;
  const int32_t* w1 = packed + b1 * G * REC;
  for (int64_t g = g0; g < g1; ++g) {
    _tile_loadd(4, a0 + g * 16, lda0 * 4);
    _tile_loadd(6, w0 + g * REC, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, w1 + g * REC, 64);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (TWO) {
      _tile_loadd(5, a1 + g * 16, lda1 * 4);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, y, sy);
  _tile_stored(1, y + 16, sy);
  if constexpr (TWO) {
    _tile_stored(2, y + 16 * ldy, sy);
    _tile_stored(3, y + 16 * ldy + 16, sy);
  }
}

// Work units of a product with N outputs (never past the packed rows: pack_bf16 pads them to a
// multiple of 64): pairs of 16-column blocks; with SwiGLU (N = I outputs of a [gate; up] weight of 2I
// rows, I a multiple of 16) one block of gate and the block of up 16 columns each that gives the same outputs.
static inline int64_t amx_unit_count(int64_t N, bool swiglu = false) { return swiglu ? N / 16 : (N + 31) / 32; }

// SwiGLU on 32 rows of a unit's sums c [32][32] (gate in columns 0-15, up in 16-31) -> out rows
// [16] bf16, one vector a row: both rounded to bf16 as the linear's output is (vcvtneps2bf16), then
// silu_mul_rows' arithmetic (common/swiglu_rows.h: exp_poly, one division, the integer rounding
// between the ops), so the bits equal the linear's bf16 output through decode_ops' silu_mul (tested;
// the scalar-shaped loop over 16 values a row took ~8% of a 2,048-token prefill step).
static inline __m512 bf16_rounded(__m512 v) {  // as the linear rounds its output
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}
static inline __m512i bf16_bits(__m512 v) {  // swiglu_rows.h float_to_bf16_bits on 16 lanes
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
}
static inline void swiglu_rows_out(const float* c, int64_t rows, uint16_t* out, int64_t ldo) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const __m512 g = bf16_rounded(_mm512_load_ps(c + i * 32)), u = bf16_rounded(_mm512_load_ps(c + i * 32 + 16));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, isa_avx512::exp_poly(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    const __m512 act = _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(silu), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * ldo), _mm512_cvtepi32_epi16(bf16_bits(_mm512_mul_ps(act, u))));
  }
}

// Units u0..u1 of out [M, N] bf16 (stride ldo) = x [M, G*16 pair words] times the packed bf16 weight: rows below
// M16 (whole 16-row tiles) read from x (stride ldx words), the others from tail [16, G*16] (stride
// ldt, zero rows past M). Any split of the units gives the same bits (qlinear.cpp's `linear` splits
// them over at::parallel_for's threads, moe.h over (expert, unit) items). Blocked so that the
// operands of the tile products come from near caches: the rows in chunks of MC (their activations
// stay in L2); per pair of blocks, K in blocks of KC groups whose weights (2 x KC KB) stay in L1
// across the chunk's rows, the chunk's running totals (MC x 32 floats) in L2 between k blocks; each
// 32 rows rounded to bf16 once (nearest even, as torch's .to(bfloat16)) as soon as their last k block
// is stored, while in L1, one 64-byte line per row (a separate pass over the chunk was ~a third of
// the kernel's time at M = 2,048).
template <bool SWIGLU = false>
static void amx_units(const int32_t* packed, int64_t G, const int32_t* x, int64_t M, int64_t ldx, int64_t M16,
                      const int32_t* tail, int64_t ldt, uint16_t* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1) {
  const int64_t Mp = (M + 15) / 16 * 16;
  const int64_t MC = std::max<int64_t>(32, X_BLOCK_BYTES / (G * GROUP * 2) / 32 * 32);
  const auto rows = [&](int64_t m) { return m < M16 ? x + m * ldx : tail + (m - M16) * ldt; };
  const auto stride = [&](int64_t m) { return m < M16 ? ldx : ldt; };
  std::vector<float> buffer(std::min(MC, Mp) * 32 + 16);
  float* c = align64(buffer.data());
  amx_configure();
  for (int64_t m0 = 0; m0 < Mp; m0 += MC) {
    const int64_t m1 = std::min(Mp, m0 + MC);
    for (int64_t u = u0; u < u1 && u * (SWIGLU ? 16 : 32) < N; ++u) {
      const int64_t n = u * (SWIGLU ? 16 : 32), cols = std::min<int64_t>(32, N - n);
      const int64_t b0 = SWIGLU ? u : 2 * u, b1 = SWIGLU ? u + N / 16 : 2 * u + 1;
      for (int64_t g0 = 0; g0 < G; g0 += KC)
        for (int64_t m = m0; m < m1; m += 32) {
          const int64_t g1 = std::min(G, g0 + KC);
          float* cm = c + (m - m0) * 32;
          if (m + 16 < Mp)
            tile_pair<true>(packed, G, b0, b1, g0, g1, rows(m), stride(m), rows(m + 16), stride(m + 16), cm, 32);
          else
            tile_pair<false>(packed, G, b0, b1, g0, g1, rows(m), stride(m), nullptr, 0, cm, 32);
          if (g1 < G) continue;
          if constexpr (SWIGLU) {
            swiglu_rows_out(cm, std::min(M, m + 32) - m, out + m * ldo + n, ldo);
            continue;
          }
          // the last k block: its 32 rows, just stored (in L1), rounded to bf16 and written out
          for (int64_t i = m; i < std::min(M, m + 32); ++i) {
            const float* ci = cm + (i - m) * 32;
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(ci + 16), _mm512_load_ps(ci));
            if (cols == 32) _mm512_storeu_si512(out + i * ldo + n, v);
            else _mm512_mask_storeu_epi16(out + i * ldo + n, (__mmask32)((1ull << cols) - 1), v);
          }
        }
    }
  }
  _tile_release();
}
}  // namespace isa_amx
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
  static inline T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static inline T add(T a, T b) { return _mm256_add_ps(a, b); }
  static inline T nibble(const int32_t* words, int t) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
    return _mm256_cvtepi32_ps(t == 7 ? _mm256_srli_epi32(v, 28) : _mm256_and_si256(v, _mm256_set1_epi32(15 << 4 * t)));
  }
  static inline T byte(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline T half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static inline T bf16_lo(const int32_t* w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), 16));
  }
  static inline T bf16_hi(const int32_t* w) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)),
                                                _mm256_set1_epi32((int)0xffff0000u)));
  }
  static constexpr bool DPBF16 = false;
};
constexpr int TILE_MIN = 4, DIRECT_P = 4, TILE_BLOCKS = 3, TILE_P = 3, MB_TILE = 4;
#include "qlinear_impl.h"

#include "qlinear_dot_avx2.h"  // W4, W8, quantize_group
#include "qlinear_dot_impl.h"
#include "exp_poly.h"     // common/: e^x (SwiGLU's)
#include "swiglu_rows.h"  // common/: SwiGLU's rows (the MoE op's; decode_ops' silu_mul runs the same)
}  // namespace isa_avx2
#pragma GCC pop_options

// The integer-dot linears on AVX-512 VNNI (qlinear_dot_vnni.h): isa_avx512's 16 lanes, vpdpbusd for
// the integer sums. Served from code 2 where the CPU has avx512_vnni (cpu_isa.h has_avx512_vnni:
// Cascade Lake and Ice Lake lack avx512_bf16, code 3); the activations quantized as on AVX2.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace isa_avx512vnni {
using isa_avx512::Vec, isa_avx512::BLOCK, isa_avx512::GROUP, isa_avx512::AHEAD, isa_avx512::store_lanes;
using isa_avx2::quantize_group;
#include "qlinear_dot_vnni.h"
#include "qlinear_dot_impl.h"
}  // namespace isa_avx512vnni
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
constexpr int TILE_MIN = 4, DIRECT_P = 16, TILE_BLOCKS = 1, TILE_P = 16, MB_TILE = 6;
#include "qlinear_impl.h"

#include "qlinear_dot_scalar.h"  // W4, W8, quantize_group
#include "qlinear_dot_impl.h"
#include "exp_poly.h"     // common/: e^x (SwiGLU's)
#include "swiglu_rows.h"  // common/: SwiGLU's rows (the MoE op's; decode_ops' silu_mul runs the same)
}  // namespace isa_scalar

#include "qlinear_kernel.h"  // the kernels of each kind as work units, the activations they read

void check_x(const at::Tensor& x, const at::Tensor& packed, int64_t isa) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "qlinear: CPU tensors only");
  TORCH_CHECK(isa_supported(isa), "qlinear: this CPU does not support instruction set ", isa);
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "qlinear: x must be [M, K] float32 or bfloat16");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kInt && packed.is_contiguous(),
              "qlinear: packed must be contiguous int32 [NB, G, REC]");
}

std::vector<int64_t> supported_isas() { return isas_up_to(4); }

// A packed weight [NB, G, rec] (packed.py pads its rows to a multiple of 64 and K to whole groups)
// fits K inputs and N outputs: the shape rule of every entry. `what` names the weight.
static void check_fit(int64_t NB, int64_t G, int64_t rec_found, int64_t rec, int64_t K, int64_t N, const char* what) {
  const int64_t Kp = G * 32;
  TORCH_CHECK(rec_found == rec && NB % 4 == 0 && N <= NB * 16 && N > NB * 16 - 64 && K <= Kp && K > Kp - 32, "qlinear: ",
              what, " [", NB, ", ", G, ", ", rec_found, "] does not fit ", K, " inputs and ", N, " outputs (records of ",
              rec, " words)");
}

// y [M, N] = x [M, K] · Wᵀ in x's dtype (kinds: qlinear_kernel.h), one linear's work units over the threads.
at::Tensor linear(at::Tensor x, at::Tensor packed, int64_t kind, int64_t N, int64_t isa) {
  check_x(x, packed, isa);
  const Kernel kernel(kind, isa, x.scalar_type() == at::kBFloat16);
  const int64_t M = x.size(0), G = packed.size(1);
  check_fit(packed.size(0), G, packed.size(2), kernel.rec(), x.size(1), N, "packed weight");
  auto out = at::empty({M, N}, x.options().dtype(kernel.out_type()));
  if (M > 0 && N > 0) {
    const Act a = kernel.prepare(x, G, true);
    const int32_t* w = packed.data_ptr<int32_t>();
    void* y = out.data_ptr();
    at::parallel_for(0, kernel.units(M, N), 1,
                     [&](int64_t begin, int64_t end) { kernel.run(w, G, a, 0, M, y, N, N, begin, end); });
  }
  return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
}

// silu(x · W_gateᵀ) * (x · W_upᵀ) [M, I] bf16 for bf16 rows x [M, K] and a bf16 [gate; up] weight of 2I
// rows on AMX (I a multiple of 16): the SwiGLU in the product's last step, where `linear` then
// silu_mul wrote [M, 2I] and read it back. The same bits as those two (swiglu_rows_out).
at::Tensor swiglu_linear(at::Tensor x, at::Tensor packed, int64_t I, int64_t isa) {
  check_x(x, packed, isa);
  const Kernel kernel(16, isa, x.scalar_type() == at::kBFloat16);
  TORCH_CHECK(kernel.amx() && I > 0 && I % 16 == 0,
              "qlinear: the fused SwiGLU runs bf16 rows on AMX (isa 4) with I a multiple of 16, got I = ", I);
  const int64_t M = x.size(0), G = packed.size(1);
  check_fit(packed.size(0), G, packed.size(2), kernel.rec(), x.size(1), 2 * I, "packed gate_up weight");
  auto out = at::empty({M, I}, x.options());
  if (M > 0) {
    const Act a = kernel.prepare(x, G, true);
    const int32_t* w = packed.data_ptr<int32_t>();
    uint16_t* y = static_cast<uint16_t*>(out.data_ptr());
    at::parallel_for(0, isa_amx::amx_unit_count(I, true), 1,
                     [&](int64_t begin, int64_t end) { kernel.run_swiglu(w, G, a, M, y, I, begin, end); });
  }
  return out;
}

// x [M, K] -> int8 codes [M, Kp], d_x [M, G], s_x [M, G] and the codes' sums [M, G] int32 as the
// integer-dot linears quantize it (qlinear_dot_impl.h; exposed for the tests' reference).
std::vector<at::Tensor> quantize_activations(at::Tensor x, int64_t G, int64_t isa) {
  check_x(x, at::empty({1, 1, 1}, at::kInt), isa);
  TORCH_CHECK(x.size(1) <= G * 32, "qlinear: x has more than G * 32 inputs");
  const Act a = Kernel(108, isa, false).prepare(x, G, false);
  return {a.rows, a.sums, a.sx, a.qsum};
}

// Which path runs the integer-dot linears on `isa` here: avx512_vnni, avx2 or scalar.
std::string dot_path(int64_t isa) {
  TORCH_CHECK(isa_supported(isa), "qlinear: this CPU does not support instruction set ", isa);
  return Kernel(104, isa, false).dot_path();
}

#include "swiglu.h"  // common/: silu_mul (decode_ops' too), for the MoE op
#include "moe.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL released while the kernels run: the server's event loop and tokenizer thread go on beside them
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>(), "int4 / int8 / bf16 / float32 (kind 4, 8, 16, 32: qlinear_impl.h) or w4a8 / w8a8 (104, 108: qlinear_dot_impl.h) linear over a packed weight");
  m.def("swiglu_linear", &swiglu_linear, py::call_guard<py::gil_scoped_release>(), "silu(gate) * up of a bf16 [gate; up] linear on AMX, in the product's last step");
  m.def("moe", &moe, py::call_guard<py::gil_scoped_release>(), "a MoE layer's routed and shared experts (see moe.h)");
  m.def("quantize_activations", &quantize_activations, py::call_guard<py::gil_scoped_release>(), "x -> the dot linears' int8 codes, d_x, s_x and the codes' sums");
  m.def("dot_path", &dot_path, "the integer-dot linears' path on an instruction set: avx512_vnni, avx2 or scalar");
  m.def("supported_isas", &supported_isas, "instruction sets this CPU runs: 0 scalar, 1 avx2+fma, 2 avx512 (integer-dot linears by VNNI where the CPU has avx512_vnni), 3 avx512 + bf16 (bf16 linears by vdpbf16ps), 4 amx (bf16 linears on AMX tiles)");
  // for the decode plan (decode_ops/decode_step.h), which calls `linear` and `moe` without Python between
  m.attr("linear_capsule") = export_fn<LinearFn>(&linear);  // of the types kernel_fns.h declares
  m.attr("moe_capsule") = export_fn<MoeFn>(&moe);
}
