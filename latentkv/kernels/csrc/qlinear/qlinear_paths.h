// The kernels of each instruction set as qlinear_kernel.h's `Kernel` picks them. Each ISA's loops are
// compiled in their own translation unit (qlinear_avx512.cpp: avx512, avx512 + bf16 dot products,
// avx512 VNNI; qlinear_amx.cpp; qlinear_avx2.cpp; qlinear_scalar.cpp; the entries in qlinear.cpp), so
// a first build compiles them in parallel; a unit hands its kernels over as these function pointers.
#pragma once
#include <cstdint>

#include "cpu_isa.h"
#include "swiglu_fns.h"

// The paths beside scalar, each the capabilities its unit's target needs (a name per path: the one it
// adds, which the self-check disables where the path disagrees with scalar). qlinear_kernel.h's Kernel
// picks among them by the caps an entry is handed.
constexpr int64_t NEEDS_AVX2 = CAP_AVX2;
constexpr int64_t NEEDS_AVX512 = CAP_AVX2 | CAP_AVX512;
constexpr int64_t NEEDS_AVX512_VNNI = NEEDS_AVX512 | CAP_AVX512_VNNI;  // the integer-dot linears by vpdpbusd
constexpr int64_t NEEDS_AVX512_BF16 = NEEDS_AVX512 | CAP_AVX512_BF16;  // bf16 rows x bf16 weights by vdpbf16ps
constexpr int64_t NEEDS_AMX_BF16 = NEEDS_AVX512_BF16 | CAP_AMX_BF16;   // bf16 linears on tiles (qlinear_amx.cpp)
constexpr int64_t NEEDS_AMX_INT8 = NEEDS_AVX512_VNNI | CAP_AMX_INT8;   // w4a8 of many rows on tiles (qlinear_amx_int8.cpp)

// Weight-only kernels (qlinear_impl.h linear_units): units u0..u1 of y [M, N] (stride ldy) = x [M, ldx
// floats] times a packed weight of G groups a row (xsum: int4's per-group sums of x).
using Units = void (*)(const int32_t* packed, int64_t G, const float* x, int64_t M, int64_t ldx, const float* xsum,
                       float* y, int64_t ldy, int64_t N, int64_t u0, int64_t u1);
// Integer-dot kernels (qlinear_dot_impl.h dot_units): int8 rows xq with their d_x, s_x, code sums.
using DotUnits = void (*)(const uint8_t* packed, int64_t G, const int8_t* xq, int64_t M, int64_t ldq, const float* xd,
                          const float* xs, const int32_t* xi, float* y, int64_t ldy, int64_t N, int64_t u0, int64_t u1);
using Count = int64_t (*)(int64_t M, int64_t N);  // (M, N) -> work units
// x [M, ldx floats] -> int8 codes [M, G * group], d_x, s_x [M, G], the codes' sums [M, G]
using Quantize = void (*)(const float* x, int64_t ldx, int64_t M, int64_t G, int64_t group, int8_t* q, float* d, float* s,
                          int32_t* qs);

struct LinearPath {
  Units int4, int8, bf16, f32;  // record kinds 4, 8, 16, 32
  Count count;
};
struct DotPath {
  DotUnits w4, w8, w4g;  // record kinds 104, 108, 114
  Count count;
  Quantize quantize;
};

namespace isa_scalar {
LinearPath linear_path();
DotPath dot_path();
}  // namespace isa_scalar
namespace isa_avx2 {
LinearPath linear_path();
DotPath dot_path();
SiluRows silu_path();  // the MoE op's SwiGLU rows (common/swiglu_rows.h)
}  // namespace isa_avx2
namespace isa_avx512 {
LinearPath linear_path();
SiluRows silu_path();
}
namespace isa_avx512bf16 {  // bf16 rows times bf16 weights by vdpbf16ps: kind 16 only
LinearPath linear_path();
}
namespace isa_avx512vnni {
DotPath dot_path();
}
namespace isa_amx {
// Units u0..u1 of out [M, N] bf16 (stride ldo) = bf16 rows times a packed bf16 weight on AMX tiles
// (qlinear_amx.cpp amx_units has the contract); swiglu: silu(gate) * up of a [gate; up] weight of 2N rows.
void units(const int32_t* packed, int64_t G, const int32_t* x, int64_t M, int64_t ldx, int64_t M16, const int32_t* tail,
           int64_t ldt, uint16_t* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1, bool swiglu);
// Work units of a product with N outputs (never past the packed rows: pack_bf16 pads them to a
// multiple of 64): pairs of 16-column blocks; with SwiGLU (N = I outputs of a [gate; up] weight of 2I
// rows, I a multiple of 16) one block of gate and the block of up 16 columns each that gives the same outputs.
inline int64_t unit_count(int64_t N, bool swiglu = false) { return swiglu ? N / 16 : (N + 31) / 32; }
// w4a8 / w4a8_g128 (record kinds 104 / 114) on AMX int8 tiles: dot_units<W4> / <W4G>'s contract and bits
// (qlinear_amx_int8.cpp), for products of many rows (AMX_DOT_ROWS and up); fewer rows keep the VNNI path.
void dot_w4_units(const uint8_t* packed, int64_t G, const int8_t* xq, int64_t M, int64_t ldq, const float* xd,
                  const float* xs, const int32_t* xi, float* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1);
void dot_w4g_units(const uint8_t* packed, int64_t G, const int8_t* xq, int64_t M, int64_t ldq, const float* xd,
                   const float* xs, const int32_t* xi, float* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1);
constexpr int64_t AMX_DOT_ROWS = 16;
}  // namespace isa_amx
