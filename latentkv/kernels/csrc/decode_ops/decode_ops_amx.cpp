// head_matmul's AMX tiles (head_amx.h), handed to decode_ops.cpp's entries through decode_ops_paths.h's
// isa_amx declarations.
#include "decode_ops_paths.h"

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
namespace isa_amx {
#include "amx_tiles.h"  // common/: the tile configuration
#include "head_amx.h"   // head_matmul's tile path
int head_steps(int K) { return amx_steps(K); }
}  // namespace isa_amx
#pragma GCC pop_options
