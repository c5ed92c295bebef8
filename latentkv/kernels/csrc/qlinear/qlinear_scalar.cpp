// qlinear's scalar kernels (qlinear.cpp has the entries and the contract): the reference every SIMD
// path is self-checked against, and what runs without AVX2; handed to qlinear_kernel.h as
// qlinear_paths.h's function pointers.
#include "qlinear_common.h"

// -O2 for this unit: -O3's vectorizer and unrolling took ~100 s of g++ on the one-lane loops (the
// longest unit of a first build by far) for ~23 s at -O2. The bits are the same: every operation is
// one IEEE step in a fixed order, fmaf where the SIMD paths fuse, and the base target has no FMA to
// contract into.
#pragma GCC optimize("O2")

namespace isa_scalar {
#include "qlinear_vec_scalar.h"
#include "qlinear_impl.h"

#include "qlinear_dot_scalar.h"  // W4, W8, quantize_group
#include "qlinear_dot_impl.h"
LinearPath linear_path() {
  return {linear_units<Int4>, linear_units<Int8>, linear_units<BF16>, linear_units<F32>, linear_unit_count};
}
DotPath dot_path() {
  return {dot_units<W4>, dot_units<W8>, dot_units<W4G>, [](int64_t, int64_t N) { return dot_unit_count(N); },
          quantize_rows};
}
}  // namespace isa_scalar
