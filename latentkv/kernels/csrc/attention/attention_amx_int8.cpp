// The decode over an int8 latent and rope key on AMX int8 tiles (mla_decode_amx_i8.h; its value sums
// on bf16 tiles, mla_decode_amx.h's), handed to mla_attention.cpp's entries as mla_paths.h's
// isa_amx_int8::decode_path. It runs only on the amx_int8 path.
#include "bf16.h"  // common/: bf16 and float16 widening at file scope
#include "mla_paths.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,amx-tile,amx-bf16,amx-int8,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_amx_int8 {
#include "exp_poly.h"
#define LATENTKV_TC_AVX512 1  // widen_tc's vpshufb / vpsrlvw runs (avx512bw, avx512vl)
#include "mla_decode_impl.h"
#include "mla_decode_bf16.h"
#include "mla_decode_vnni.h"  // quantize_two_part
#include "amx_tiles.h"        // common/: the tile configuration
#include "mla_decode_amx.h"
#include "mla_decode_amx_i8.h"
#include "mla_decode_run.h"

// bf16 query rows in int8 twice (hi, lo) a part, packed once per call as the B tiles with their scales
// (pack_queries_i8), each thread's tiles configured for its items
static void decode_amx_i8(const DecodeWork& w) {
  const int64_t qblocks = (w.M + 15) / 16 * amx_i8_query_block((int)w.D);
  // not zeroed: pack_queries_i8 writes every step the kernel reads
  std::unique_ptr<uint32_t[]> qpack(new uint32_t[w.B * qblocks]);
  std::vector<float> qscale(w.B * w.M * 2);
  pack_queries_i8(w.q16, w.B, (int)w.M, (int)w.D, (int)w.r, qpack.get(), qscale.data(), w.pack_threads);
  run_items<AmxThreadScratch>(w, [&](AmxThreadScratch& s, int64_t it) {
    const int64_t b = w.item_b[it];
    attend_span_amx_i8(*w.job, b, w.item_t0[it], w.item_t1[it], qpack.get() + b * qblocks, qscale.data() + b * w.M * 2,
                       w.lim + b * w.M, w.acc + it * w.M * w.r, w.mx + it * w.M, w.sum + it * w.M, s.scratch(), s.amx);
  });
}

DecodeRun decode_path() { return decode_amx_i8; }
}  // namespace isa_amx_int8
#pragma GCC pop_options
