// The sampler's rows on AVX2 + FMA (sample_impl.h, auto-vectorized 8 lanes wide).
#include "sample_common.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
#include "exp_poly.h"  // common/: e^x
#include "sample_impl.h"
}  // namespace isa_avx2
#pragma GCC pop_options
