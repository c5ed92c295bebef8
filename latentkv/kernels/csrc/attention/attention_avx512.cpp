// The attention loops on AVX-512 (float32 FMAs at 16 lanes: mla_decode_impl.h, mla_prefill_f32.h),
// handed to mla_attention.cpp's entries as mla_paths.h's FloatPath.
#include "bf16.h"  // common/: bf16 and float16 widening at file scope
#include "mla_paths.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_avx512 {
#include "exp_poly.h"
#define LATENTKV_TC_AVX512 1  // widen_tc's vpshufb / vpsrlvw runs (avx512bw, avx512vl)
#include "mla_decode_impl.h"
#include "mla_prefill_f32.h"
#include "mla_decode_run.h"
FloatPath float_path() { return {decode_f32<attend_span>, merge_row, f32_prefill<16>}; }
}  // namespace isa_avx512
#pragma GCC pop_options
