// qlinear's AVX2 kernels (qlinear.cpp has the entries and the contract): the float loops, the
// integer-dot linears by maddubs and the MoE op's SwiGLU rows, handed to the entries as qlinear_paths.h's
// function pointers.
#include "qlinear_common.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
#include "qlinear_vec_avx2.h"
#include "qlinear_impl.h"

#include "qlinear_dot_avx2.h"  // W4, W8, quantize_group
#include "qlinear_dot_impl.h"
LinearPath linear_path() {
  return {linear_units<Int4>, linear_units<Int8>, linear_units<BF16>, linear_units<F32>, linear_unit_count};
}
DotPath dot_path() {
  return {dot_units<W4>, dot_units<W8>, dot_units<W4G>, [](int64_t, int64_t N) { return dot_unit_count(N); },
          quantize_rows};
}
#include "exp_poly.h"     // common/: e^x (SwiGLU's)
#include "swiglu_rows.h"  // common/: SwiGLU's rows (decode_ops' silu_mul runs the same)
SiluRows silu_path() { return {silu_mul_rows, silu_mul_rows}; }
}  // namespace isa_avx2
#pragma GCC pop_options
