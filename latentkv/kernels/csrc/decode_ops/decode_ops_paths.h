// The decode ops' paths (decode_ops.cpp has the entries and the contract): the capabilities each
// needs, and the loops of each, compiled in its own translation unit under its target
// (decode_ops_scalar.cpp, decode_ops_avx2.cpp, decode_ops_avx512.cpp, decode_ops_amx.cpp, so a first
// build compiles them in parallel) and handed to the entries as these function pointers.
#pragma once
#include "cpu_isa.h"
#include "swiglu_fns.h"
#include "torch_lite.h"

#include <cstdint>

// The paths beside scalar: the vector rows of every op (avx2, avx512) and head_matmul's AMX tiles (amx_bf16).
constexpr int64_t NEEDS_AVX2 = CAP_AVX2, NEEDS_AVX512 = CAP_AVX2 | CAP_AVX512,
                  NEEDS_AMX_BF16 = NEEDS_AVX512 | CAP_AVX512_BF16 | CAP_AMX_BF16;

// One vector path's row loops (decode_ops_impl.h, and common/swiglu_rows.h's SwiGLU rows).
struct RowPath {
  void (*head_rows_f32)(const float*, int, int, const float*, int, float*);
  void (*head_rows_bf16)(const float*, int, int, const uint16_t*, int, float*);
  void (*head_out_bf16)(const float*, int64_t, const uint16_t*, int64_t, float, uint16_t*);
  void (*rotate_f32)(const float*, int64_t, const float*, const float*, bool, float*);
  void (*rotate_bf16)(const uint16_t*, int64_t, const float*, const float*, bool, float*);
  void (*round_bf16)(float*, int64_t, uint16_t*, bool);
  float (*absmax_f32)(const float*, int64_t);
  float (*absmax_bf16)(const uint16_t*, int64_t);
  void (*quantize_f32)(const float*, int64_t, float, int8_t*);
  void (*quantize_bf16)(const uint16_t*, int64_t, float, int8_t*);
  void (*rms_norm_f32)(const float*, const float*, float*, const float*, float, float*, int64_t, int64_t, int64_t,
                       float*);
  void (*rms_norm_bf16)(const uint16_t*, const uint16_t*, uint16_t*, const uint16_t*, float, uint16_t*, int64_t,
                        int64_t, int64_t, float*);
  SiluRows silu;
};

namespace isa_scalar {
RowPath row_path();
}
namespace isa_avx2 {
RowPath row_path();
}
namespace isa_avx512 {
RowPath row_path();
}
namespace isa_amx {
// head_matmul's tiles apply where K >= 32 and even and C % 16 == 0 (head_amx.h); elsewhere the vector rows serve.
inline bool head_applies(int64_t K, int64_t C) { return K >= 32 && K % 2 == 0 && C % 16 == 0; }
int head_steps(int K);  // the tile steps over K of a packed weight (amx_tiles.h amx_steps)
// w [H, K, C] bf16 bits -> packed [H, steps, 16, C, 2] (head_amx.h head_pack)
void head_pack(const uint16_t* w, int64_t H, int K, int C, uint16_t* out);
// out [N, H, C + E] bf16 = x [N, H, K] . packed, times s, with extra beside (head_amx.h head_matmul_amx)
void head_matmul_amx(const at::Tensor& x, const at::Tensor& packed, float s, const at::Tensor& extra, at::Tensor& out);
}  // namespace isa_amx
