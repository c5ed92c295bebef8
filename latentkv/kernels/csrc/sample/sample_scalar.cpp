// The sampler's rows without SIMD extensions (sample_impl.h): the reference every vector path is
// self-checked against, and what runs without AVX2.
#include "sample_common.h"

namespace isa_scalar {
#include "exp_poly.h"  // common/: e^x
#include "sample_impl.h"
}  // namespace isa_scalar
