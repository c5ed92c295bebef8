// The attention loops on AMX bf16 tiles, handed to mla_attention.cpp's entries as mla_paths.h's
// TilePath: bf16 queries' scores and value sums (mla_decode_amx.h), the bf16 prefill (mla_prefill_amx.h).
// They run only on the amx_bf16 path (the compiler never emits tile instructions of its own).
#include "bf16.h"  // common/: bf16 and float16 widening at file scope
#include "mla_paths.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,amx-tile,amx-bf16,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_amx_bf16 {
#include "exp_poly.h"
#define LATENTKV_TC_AVX512 1  // widen_tc's vpshufb / vpsrlvw runs (avx512bw, avx512vl)
#include "mla_decode_impl.h"
#include "mla_decode_bf16.h"
#include "mla_prefill_bf16.h"
#include "mla_prefill_amx.h"  // (and common/amx_tiles.h)
#include "mla_decode_amx.h"
#include "mla_decode_run.h"

// bf16 query rows packed once per call as the B tiles (pack_queries), each thread's tiles configured
// for its items
static void decode_amx(const DecodeWork& w) {
  const bool split = w.job->kind == KIND_I8 || w.job->kind == KIND_FP8;  // latent and rope scored apart
  const int64_t qblocks = (w.M + 15) / 16 * (split ? 2 : 1) * amx_query_block((int)w.D);
  // not zeroed: pack_queries writes every step the kernel reads (786 KB a layer at 32 sequences)
  std::unique_ptr<uint32_t[]> qpack(new uint32_t[w.B * qblocks]);
  pack_queries(w.q16, w.B, (int)w.M, (int)w.D, (int)w.r, split, qpack.get(), w.pack_threads);
  run_items<AmxThreadScratch>(w, [&](AmxThreadScratch& s, int64_t it) {
    const int64_t b = w.item_b[it];
    attend_span_amx(*w.job, b, w.item_t0[it], w.item_t1[it], qpack.get() + b * qblocks, w.lim + b * w.M,
                    w.acc + it * w.M * w.r, w.mx + it * w.M, w.sum + it * w.M, s.scratch(), s.amx);
  });
}

static void prefill_amx(const PrefillSpan& p) {
  PrefillJob job = prefill_job(p);
  amx_layout(job);  // whole tiles of pairs: keys read in place or packed
  prefill_buffers(job);
  prefill_run_amx(job, p.threads);
}

TilePath tile_path() { return {decode_amx, prefill_amx}; }
}  // namespace isa_amx_bf16
#pragma GCC pop_options
