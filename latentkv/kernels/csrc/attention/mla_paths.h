// The attention kernels' paths (mla_attention.cpp has the entries and the contract): the capabilities
// each needs, and the loops of each, compiled in its own translation unit under its target
// (attention_scalar.cpp, attention_avx2.cpp, attention_avx512.cpp, attention_avx512_bf16.cpp,
// attention_amx_bf16.cpp, attention_amx_int8.cpp, so a first build compiles them in parallel) and
// handed to the entries as these function pointers. Every unit runs a decode's work items and a
// prefill span as the entry prepared them (DecodeWork, PrefillSpan): the entry checks, chooses, and
// merges; a unit only loops.
#pragma once
#include "cpu_isa.h"
#include "mla_job.h"

#include <cstdint>

// The paths beside scalar, each the capabilities its unit's target needs: float32 FMAs at avx2's and
// avx512's widths; bf16 and int8 dot products (avx512_bf16: vdpbf16ps, vpdpbusd); bf16 tiles for the
// prefill and the bf16 decode (amx_bf16); int8 tiles for an int8 latent and rope key (amx_int8, whose
// value sums stay amx_bf16's).
constexpr int64_t NEEDS_AVX2 = CAP_AVX2, NEEDS_AVX512 = CAP_AVX2 | CAP_AVX512,
                  NEEDS_AVX512_BF16 = NEEDS_AVX512 | CAP_AVX512_VNNI | CAP_AVX512_BF16,
                  NEEDS_AMX_BF16 = NEEDS_AVX512_BF16 | CAP_AMX_BF16, NEEDS_AMX_INT8 = NEEDS_AMX_BF16 | CAP_AMX_INT8;

// One decode call as the entry prepared it: the cache (job), the work items (spans of one sequence's
// keys at fixed positions), the keys each query row sees, each item's running state, and the queries.
struct DecodeWork {
  const Job* job;
  int64_t B, M, D, r;                          // sequences, query rows per sequence, row width, latent rank
  int64_t items;                               // work items
  const int64_t *item_b, *item_t0, *item_t1;   // [items]: the item's sequence, first token, end token
  const int64_t* lim;                          // [B, M]: the keys row m of sequence b sees
  float *acc, *mx, *sum;                       // [items, M, r], [items, M], [items, M]: set by each item
  const float* qf;                             // [B, M, D] float32 queries (the float loops)
  const uint16_t* q16;                         // [B, M, D] bf16 queries (the dot-product and tile loops)
  int threads;                                 // the items' team (no more than the items)
  int pack_threads;                            // the tile paths' query packing (no more than B)
};
// Runs every work item of a decode, on its team.
using DecodeRun = void (*)(const DecodeWork&);
// One query row's log-sum-exp merge of its sequence's items (mla_decode_impl.h merge_row): acc, mx,
// sum at the row's first item, `stride` rows apart -> out32 or out16 [r] (row: [r] scratch).
using MergeRow = void (*)(const float* acc, const float* mx, const float* sum, int64_t items, int64_t stride, int r,
                          float* row, float* out32, uint16_t* out16);

// One prefill span as the entry checked it (mla_prefill_f32.h and mla_prefill_bf16.h have the contract):
// q [n, H, dn + dr], kv [S, kvh, dn + dv], k_r [S, groups, dr] in one dtype, the state m, l [n, H] and
// acc [n, H, dvp] float32 updated in place.
struct PrefillSpan {
  int64_t n, H, dn, dr, dv, dvp, S, groups, kvh;
  int64_t first, key_start;  // q's first row's position; k_r's first key's
  float scale;
  bool bf16;  // q, kv, k_r bf16 (else float32)
  const void *q, *kv, *kr;
  float *m, *l, *acc;
  int threads;
};
using PrefillRun = void (*)(const PrefillSpan&);

// One ISA's float32 loops: the decode of float32 query rows (bf16 ones widened by the entry) over any
// cache, the merge, and the float32 prefill kernel at the ISA's width (bf16 tensors widened as packed).
struct FloatPath {
  DecodeRun decode;
  MergeRow merge;
  PrefillRun prefill;
};

namespace isa_scalar {
FloatPath float_path();
}
namespace isa_avx2 {
FloatPath float_path();
}
namespace isa_avx512 {
FloatPath float_path();
}
namespace isa_avx512bf16 {
// the avx512 loops compiled for this target (prefill: nullptr, avx512's serves)
FloatPath float_path();
// bf16 queries: vdpbf16ps over a bf16 cache or widened codes (mla_decode_bf16.h); an int8 latent with
// a bf16 rope key: vpdpbusd (mla_decode_vnni.h); the bf16 prefill (mla_prefill_bf16.h)
struct DotPath {
  DecodeRun decode_bf16, decode_i8;
  PrefillRun prefill;
};
DotPath dot_path();
}  // namespace isa_avx512bf16
namespace isa_amx_bf16 {
// bf16 queries: scores and value sums on bf16 tiles (mla_decode_amx.h); the bf16 prefill on tiles
// (mla_prefill_amx.h), which sets a first span's state itself
struct TilePath {
  DecodeRun decode;
  PrefillRun prefill;
};
TilePath tile_path();
}  // namespace isa_amx_bf16
namespace isa_amx_int8 {
DecodeRun decode_path();  // an int8 latent and rope key: int8 tile products (mla_decode_amx_i8.h)
}
