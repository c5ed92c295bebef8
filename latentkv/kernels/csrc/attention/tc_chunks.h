// A transform-coded layer's chunks (TcChunk, mla_job.h), built from its runs once a call by
// mla_attention.cpp's mla_decode_coded: what tc_chunk32 (mla_decode_impl.h) reads on AVX-512.
#pragma once
#include "mla_job.h"

#include <algorithm>
#include <cstdint>
#include <vector>

// The layer's runs as chunks of 32 columns (TcChunk), and each scale group's STEP; none (chunks left
// empty: the kernels read the runs) where a chunk's codes span more than its window, the token has more
// scale groups than the chunks read, or the last chunk would pass the row's end (a float32 tile's rows are
// the row's width apart; coded.kernel_view's rows are multiples of 32 wide, so it never does there).
inline void tc_chunks(const TcLayout& tc, std::vector<TcChunk>& chunks, float* group_step) {
  const int n = (tc.values + 31) / 32;
  if (tc.groups > TC_CHUNK_GROUPS || 32 * n > tc.values + tc.cs_width) return;
  std::vector<int64_t> bit(32 * n, -1);  // each column's first bit (-1: no code)
  std::vector<int> width(32 * n, 0), group(32 * n, 0);
  std::vector<float> off(32 * n, 0.0f);
  for (int k = 0; k < tc.n_runs; ++k) {
    const int32_t* r = tc.runs + (int64_t)k * TC_RUN;
    group_step[r[5]] = tc.steps[2 * k];
    for (int j = 0; j < r[3]; ++j) {
      const int col = r[4] + j;
      bit[col] = 8 * (int64_t)r[0] + r[1] + (int64_t)j * r[2], width[col] = r[2], group[col] = r[5];
      off[col] = tc.steps[2 * k + 1];
    }
  }
  chunks.resize(n);
  for (int c = 0; c < n; ++c) {
    TcChunk& ch = chunks[c];
    int64_t base = -1, last = -1;
    for (int i = 0; i < 32; ++i)
      if (bit[32 * c + i] >= 0) {
        const int64_t at = bit[32 * c + i] >> 3;
        base = base < 0 || at < base ? at : base, last = at > last ? at : last;
      }
    if (base < 0) base = 0, last = 0;
    if (last - base > 62) {  // (a pair of bytes k, k + 1 from the window: k <= 62)
      chunks.clear();
      return;
    }
    ch.base = (int32_t)base;
    const int64_t in_a = std::min<int64_t>(64, std::max<int64_t>(0, tc.code_bytes - base));
    const int64_t in_b = std::min<int64_t>(64, std::max<int64_t>(0, tc.code_bytes - base - 1));
    ch.load_a = in_a == 64 ? ~0ull : (1ull << in_a) - 1, ch.load_b = in_b == 64 ? ~0ull : (1ull << in_b) - 1;
    for (int i = 0; i < 32; ++i) {
      const int col = 32 * c + i;
      const int64_t k = bit[col] < 0 ? 0 : (bit[col] >> 3) - base;
      ch.index[i] = (uint16_t)(k % 2 ? 32 + (k - 1) / 2 : k / 2);
      ch.shift[i] = (uint16_t)(bit[col] < 0 ? 0 : bit[col] & 7);
      ch.mask[i] = (uint16_t)((1u << width[col]) - 1);
      ch.group[i] = group[col], ch.off[i] = off[col];
    }
  }
}
