// The decode ops' row loops on AVX2 + FMA (8 float lanes), handed to decode_ops.cpp's
// entries as decode_ops_paths.h's RowPath.
#include "decode_ops_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
constexpr int HEAD_W = 8, HEAD_NV4 = 2, HEAD_NV1 = 8;  // 8 of 16 registers: more would spill
#include "exp_poly.h"     // common/: one e^x for every kernel
#include "swiglu_rows.h"  // common/: SwiGLU's rows, the MoE op's too
#include "decode_ops_impl.h"
RowPath row_path() {
  return {head_rows_f32,     head_rows_bf16, head_out_bf16, rotate_vals_f32,   rotate_vals_bf16,
          round_vals_bf16,   absmax_f32,     absmax_bf16,   quantize_f32,      quantize_bf16,
          rms_norm_rows_f32, rms_norm_rows_bf16, {silu_mul_rows, silu_mul_rows}};
}
}  // namespace isa_avx2
#pragma GCC pop_options
