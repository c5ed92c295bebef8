// The sampler's rows on AVX-512 (sample_impl.h, auto-vectorized 16 lanes wide).
#include "sample_common.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace isa_avx512 {
#include "exp_poly.h"  // common/: e^x
#include "sample_impl.h"
}  // namespace isa_avx512
#pragma GCC pop_options
