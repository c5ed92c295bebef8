// The decode ops' row loops on AVX-512 (16 float lanes), handed to decode_ops.cpp's
// entries as decode_ops_paths.h's RowPath.
#include "decode_ops_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_avx512 {
constexpr int HEAD_W = 16, HEAD_NV4 = 4, HEAD_NV1 = 8;  // 16 of 32 registers hold a 4-row tile's accumulators
#include "exp_poly.h"     // common/: one e^x for every kernel
#include "swiglu_rows.h"  // common/: SwiGLU's rows, the MoE op's too
#include "decode_ops_impl.h"
RowPath row_path() {
  return {head_rows_f32,     head_rows_bf16, head_out_bf16, rotate_vals_f32,   rotate_vals_bf16,
          round_vals_bf16,   absmax_f32,     absmax_bf16,   quantize_f32,      quantize_bf16,
          rms_norm_rows_f32, rms_norm_rows_bf16, {silu_mul_rows, silu_mul_rows}};
}
}  // namespace isa_avx512
#pragma GCC pop_options
