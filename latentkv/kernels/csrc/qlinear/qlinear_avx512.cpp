// qlinear's AVX-512 kernels (qlinear.cpp has the entries and the contract): the float loops
// (isa_avx512), bf16 rows times bf16 weights by vdpbf16ps (isa_avx512bf16), and the integer-dot
// linears by VNNI (isa_avx512vnni), and the MoE op's SwiGLU rows, handed to the entries as qlinear_paths.h's
// function pointers.
#include "qlinear_common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace isa_avx512 {
#include "qlinear_vec_avx512.h"
#include "qlinear_impl.h"
LinearPath linear_path() {
  return {linear_units<Int4>, linear_units<Int8>, linear_units<BF16>, linear_units<F32>, linear_unit_count};
}
#include "exp_poly.h"     // common/: e^x (SwiGLU's)
#include "swiglu_rows.h"  // common/: SwiGLU's rows (decode_ops' silu_mul runs the same)
SiluRows silu_path() { return {silu_mul_rows, silu_mul_rows}; }
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
constexpr int TILE_MIN = 12, DIRECT_P = 4, DIRECT_MB = 6, TILE_BLOCKS = 4, TILE_P = 4, MB_TILE = 6;
#include "qlinear_impl.h"
LinearPath linear_path() { return {nullptr, nullptr, linear_units<BF16>, nullptr, linear_unit_count}; }
}  // namespace isa_avx512bf16
#pragma GCC pop_options

// The quantizer and the formats the VNNI path shares with AVX2 (qlinear_dot_avx2.h); the avx2 loops
// themselves are qlinear_avx2.cpp's.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
#include "qlinear_vec_avx2.h"
#include "qlinear_impl.h"
#include "qlinear_dot_avx2.h"  // W4, W8, quantize_group
}  // namespace isa_avx2
#pragma GCC pop_options

// The integer-dot linears on AVX-512 VNNI (qlinear_dot_vnni.h): isa_avx512's 16 lanes, vpdpbusd for
// the integer sums. The avx512_vnni path (qlinear_paths.h): on any CPU with avx512 and avx512_vnni,
// with or without avx512_bf16 (Cascade Lake and Ice Lake lack it); the activations quantized as on AVX2.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace isa_avx512vnni {
using isa_avx512::Vec, isa_avx512::BLOCK, isa_avx512::GROUP, isa_avx512::store_lanes;
using isa_avx2::quantize_group;
#include "qlinear_dot_vnni.h"
#include "qlinear_dot_impl.h"
DotPath dot_path() {
  return {dot_units<W4>, dot_units<W8>, dot_units<W4G>, [](int64_t, int64_t N) { return dot_unit_count(N); },
          quantize_rows};
}
}  // namespace isa_avx512vnni
#pragma GCC pop_options
