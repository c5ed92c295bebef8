// The attention loops on the baseline x86-64 (or any other CPU's) code: the reference the other paths
// are self-checked against, handed to mla_attention.cpp's entries as mla_paths.h's FloatPath.
#include "bf16.h"  // common/: bf16 and float16 widening at file scope
#include "mla_paths.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace isa_scalar {
#include "exp_poly.h"  // common/: one e^x for every kernel
#include "mla_decode_impl.h"
#include "mla_prefill_f32.h"
#include "mla_decode_run.h"
FloatPath float_path() { return {decode_f32<attend_span>, merge_row, f32_prefill<4>}; }
}  // namespace isa_scalar
