// What every attention loop shares: the decode job, the tile and span sizes, the latent's kinds, the
// prefill's key block and the software prefetch. Included at file scope by every unit of the family
// (mla_paths.h) before its ISA namespace; each kernel header includes it too (guarded, so there a
// no-op) to say what it uses.
#pragma once
#include <cstdint>

// KIND_Q4: llama.cpp's q4_0 blocks for the latent and the (turned) rope key (latentkv/cache/q4.py);
// KIND_TC: a transform code's packed codes of mixed widths (latentkv/cache/coded.py; TcLayout below)
enum Kind { KIND_F32 = 0, KIND_BF16 = 1, KIND_I8 = 2, KIND_FP8 = 3, KIND_Q4 = 4, KIND_TC = 5 };
constexpr int Q4_GROUP = 32;  // values per float16 scale (cache/q4.py: facts.Q4_GROUP)
// a q4_0 row of n values (cache/q4.py packed_bytes, groups): its code bytes and its scales
constexpr int64_t q4_bytes(int64_t n) { return (n + 1) / 2; }
constexpr int64_t q4_groups(int64_t n) { return (n + Q4_GROUP - 1) / Q4_GROUP; }
constexpr int TILE = 16;        // tokens widened at once: 16 x 576 floats (37 KB) stay in L1
constexpr int64_t SPAN = 256;   // fewest tokens per work item (shorter items cost more in set-up and merge than a second thread gains)
constexpr int64_t MAX_SPANS = 64;  // spans sit at fixed positions (SPAN apart) for contexts up to SPAN x MAX_SPANS
constexpr int PREFILL_KB = 64;     // the prefill kernels' key block (mla_prefill_f32.h F32_KB, mla_prefill_bf16.h KB)

// Software prefetch as volatile asm: GCC (12, -O1 and up) deletes _mm_prefetch / __builtin_prefetch
// loops over the block table as code without effects, so the kernels' prefetches never ran.
inline void prefetch_l1(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*(const char*)p));
#endif
}
inline void prefetch_l2(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*(const char*)p));
#endif
}

// How a transform-coded token is read (cache/coded.py kernel_view): its codes cut into runs of at most 16
// values of one width, each inside 16 bytes from its first; a token's row widens to [the stored values,
// then cos and sin of its position] (the query was turned to match: its rope key's mean term).
constexpr int TC_RUN = 6;            // int32 fields of a run: byte, shift, bits, count, column, scale group
constexpr int TC_SLACK = 16;         // floats past a row that a run's unused lanes may write
constexpr int TC_MAX_GROUPS = 512;   // scale groups a coded token may have (mla_decode_coded checks)
// 32 columns of a transform-coded row read in one pass on AVX-512 (tc_chunk32, mla_decode_impl.h): the
// codes' 64-byte window from `base` (and again from base + 1), which bytes of each lie inside the token's
// codes (masked loads: no read past them), and per column the window word vpermi2w takes (byte k: word k/2
// of the first window, or 32 + (k-1)/2 of the second when k is odd), its shift and mask in that word, its
// scale group and offset (2^(b-1) - 1/2; 0 and mask 0 for a column with no code: the value 0).
struct alignas(64) TcChunk {
  uint16_t index[32], shift[32], mask[32];
  int32_t group[32];
  float off[32];
  uint64_t load_a, load_b;
  int32_t base;
};
constexpr int TC_CHUNK_GROUPS = 32;  // scale groups the chunks read (vpermi2ps over two vectors); more: runs

struct TcLayout {
  const int32_t* runs;  // [n_runs, TC_RUN]
  const float* steps;   // [n_runs, 2]: the code's step (STEP[bits]) and its offset (2^(bits-1) - 1/2)
  int n_runs, code_bytes, groups, values;  // values: the stored values of both sides (the row's first columns)
  int inner;            // the runs (the first ones) whose 24 bytes lie inside the token's codes
  const TcChunk* chunks;  // [n_chunks]: columns [0, 32 n_chunks) by chunks (AVX-512; 0: by runs)
  int n_chunks;
  const float* group_step;  // [TC_CHUNK_GROUPS]: each scale group's STEP (0 past the groups)
  const float* cs;      // [cs_rows, cs_width] float32: cos then sin (times the RoPE factor) of position j
  int cs_width;
  int64_t cs_rows;
};

struct Job {
  int M, D, r, bs, kind;
  int64_t nb;
  bool rope_bf16;  // the rope key beside a quantized latent: bf16, else float32 (or int8 codes: rope_i8)
  bool rope_i8;    // int8 rope codes, their scale the second of each token's two (scale_stride 2)
  int scale_stride;  // scales per token: 1 (the latent's), 2 (latent's, rope's); KIND_Q4: its groups
  const void* kv;
  const void* latent;
  const float* scale;
  const void* rope;
  const uint16_t* scale16;  // KIND_Q4: float16 scales, scale_stride per token (the latent's groups, then the rope's)
  const int64_t* block_tables;
  TcLayout tc;  // KIND_TC only; its codes are `latent`, its float16 scales `scale16` (tc.groups per token)
};

// Work item `it` of a prefill span's parallel loop over (head, block of rows): heads outer, so a
// thread's next item reads the same head's keys and values, still in its L2 (heads inner cycled
// every head's through it: a 2,048 x 2,048 span on AMX 10-20% slower); within a head the last rows
// first, as they see the most keys, so dynamic scheduling ends balanced.
inline void prefill_item_of(int64_t it, int items_per_head, int* h, int* b) {
  *h = (int)(it / items_per_head);
  *b = items_per_head - 1 - (int)(it % items_per_head);
}
