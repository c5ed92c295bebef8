// The latent caches the decode kernel reads, declared once: one entry per way latentkv/cache/format.py
// CacheFormat stores a layer, named as CacheFormat.storage names it (LatentCache.kernel_tensors hands
// over its kv, latent, scale and rope tensors, the ones it lacks empty). kernels/attention.py cache_kind
// passes the entry's index (the module's cache_kinds() lists the names in this order); mla_decode checks
// the tensors against it, never guessing the format from their dtypes.
// X(name, latent kind (mla_job.h), rope key, then the dtypes of kv, latent, scale, rope: Undefined where
// the format has no such tensor).
#pragma once
#include "mla_job.h"
#include "torch_lite.h"

#include <cstdint>

// The rope key: in the kv row beside the latent, bf16, int8 codes (their scale the second of a token's
// two), or q4_0 blocks turned (cache/q4.py).
enum RopeStore { ROPE_IN_ROW = 0, ROPE_BF16 = 1, ROPE_I8 = 2, ROPE_Q4 = 3 };

// (fp8 e4m3 codes are stored as their bits, uint8: index_put on float8 tensors is not implemented everywhere)
#define LATENTKV_CACHE_KINDS(X)                                                     \
  X(kv_float32, KIND_F32, ROPE_IN_ROW, Float, Undefined, Undefined, Undefined)      \
  X(kv_bfloat16, KIND_BF16, ROPE_IN_ROW, BFloat16, Undefined, Undefined, Undefined) \
  X(int8_bfloat16, KIND_I8, ROPE_BF16, Undefined, Char, Float, BFloat16)            \
  X(int8_int8, KIND_I8, ROPE_I8, Undefined, Char, Float, Char)                      \
  X(fp8_e4m3_bfloat16, KIND_FP8, ROPE_BF16, Undefined, Byte, Float, BFloat16)       \
  X(fp8_e4m3_int8, KIND_FP8, ROPE_I8, Undefined, Byte, Float, Char)                 \
  X(q4_0, KIND_Q4, ROPE_Q4, Undefined, Byte, Half, Byte)

struct CacheKind {
  const char* name;
  Kind latent;
  RopeStore rope;
  at::ScalarType dtypes[4];  // kv, latent, scale, rope
};

#define LATENTKV_CACHE_KIND_ENTRY(name, latent, rope, kv, codes, scale, rope_t) \
  {#name, latent, rope, {at::ScalarType::kv, at::ScalarType::codes, at::ScalarType::scale, at::ScalarType::rope_t}},
constexpr CacheKind CACHE_KINDS[] = {LATENTKV_CACHE_KINDS(LATENTKV_CACHE_KIND_ENTRY)};
#undef LATENTKV_CACHE_KIND_ENTRY
constexpr int64_t CACHE_KIND_COUNT = sizeof(CACHE_KINDS) / sizeof(CACHE_KINDS[0]);
