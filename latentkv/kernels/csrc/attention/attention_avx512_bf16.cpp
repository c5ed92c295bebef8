// The attention loops on AVX-512 with bf16 and int8 dot products, handed to mla_attention.cpp's
// entries as mla_paths.h's FloatPath and DotPath: float32 query rows run the avx512 loops compiled
// here; bf16 ones vdpbf16ps (mla_decode_bf16.h), or vpdpbusd over an int8 latent beside a bf16 rope
// key (mla_decode_vnni.h); the bf16 prefill vdpbf16ps (mla_prefill_bf16.h).
#include "bf16.h"  // common/: bf16 and float16 widening at file scope
#include "mla_paths.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx2,fma,f16c,prefer-vector-width=512")
namespace isa_avx512bf16 {
#include "exp_poly.h"
#define LATENTKV_TC_AVX512 1  // widen_tc's vpshufb / vpsrlvw runs (avx512bw, avx512vl)
#include "mla_decode_impl.h"
#include "mla_decode_bf16.h"
#include "mla_decode_vnni.h"
#include "mla_prefill_bf16.h"
#include "mla_decode_run.h"

FloatPath float_path() { return {decode_f32<attend_span>, merge_row, nullptr}; }

// bf16 query rows over a bf16 cache or widened codes
static void decode_bf16(const DecodeWork& w) {
  struct Scratch : Bf16Buffers {
    explicit Scratch(const DecodeWork& w) : Bf16Buffers(w.D, w.r) {}
  };
  run_items<Scratch>(w, [&w](Scratch& s, int64_t it) {
    const int64_t b = w.item_b[it];
    attend_span_bf16(*w.job, b, w.item_t0[it], w.item_t1[it], w.q16 + b * w.M * w.D, w.lim + b * w.M,
                     w.acc + it * w.M * w.r, w.mx + it * w.M, w.sum + it * w.M, s.scratch());
  });
}

// bf16 query rows over an int8 latent and a bf16 rope key: the query's latent part in int8 (two
// parts a row: mla_decode_vnni.h quantize_rows), once per call
static void decode_i8(const DecodeWork& w) {
  const int64_t rows = w.B * w.M;
  std::vector<int8_t> q8(rows * 2 * w.r);
  std::vector<float> qs(rows);
  std::vector<int32_t> qsum(rows * 2);
  quantize_rows(w.q16, rows, (int)w.D, (int)w.r, q8.data(), qs.data(), qsum.data());
  struct Scratch : Bf16Buffers {
    std::vector<float> sc;  // a tile's scores and weights
    explicit Scratch(const DecodeWork& w) : Bf16Buffers(w.D, w.r), sc(TILE + 64 + w.r) {}
  };
  run_items<Scratch>(w, [&](Scratch& s, int64_t it) {
    const int64_t b = w.item_b[it];
    attend_span_i8(*w.job, b, w.item_t0[it], w.item_t1[it], w.q16 + b * w.M * w.D, q8.data() + b * w.M * 2 * w.r,
                   qs.data() + b * w.M, qsum.data() + b * w.M * 2, w.lim + b * w.M, w.acc + it * w.M * w.r,
                   w.mx + it * w.M, w.sum + it * w.M, s.scratch(), s.sc.data());
  });
}

static void prefill_bf16(const PrefillSpan& p) {
  PrefillJob job = prefill_job(p);
  prefill_buffers(job);
  prefill_run(job, p.threads);
}

DotPath dot_path() { return {decode_bf16, decode_i8, prefill_bf16}; }
}  // namespace isa_avx512bf16
#pragma GCC pop_options
