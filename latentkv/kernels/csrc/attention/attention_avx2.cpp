// The attention loops on AVX2 + FMA (float32 queries: intrinsics, three heads per pass,
// mla_decode_avx2.h; the float32 prefill at 8 lanes), handed to mla_attention.cpp's entries as
// mla_paths.h's FloatPath.
#include "bf16.h"  // common/: bf16 and float16 widening at file scope
#include "mla_paths.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
#include "exp_poly.h"
#include "mla_decode_impl.h"
#include "mla_decode_avx2.h"
#include "mla_prefill_f32.h"
#include "mla_decode_run.h"
FloatPath float_path() { return {decode_f32<attend_span_fast>, merge_row, f32_prefill<8>}; }
}  // namespace isa_avx2
#pragma GCC pop_options
