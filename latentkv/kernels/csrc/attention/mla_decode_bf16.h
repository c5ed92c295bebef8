// Paged MLA decode with bf16 dot products (avx512_bf16: vdpbf16ps), for bf16 queries. Included
// by attention_avx512_bf16.cpp (and the amx units) inside its namespace under a target pragma, after
// exp_poly.h (e^x) and mla_decode_impl.h (the float32 fallback). Its includes: mla_job.h (Job, TILE, the cache kinds, prefetch), guarded: a no-op here; widen_bf16.h
// (codes to bf16).
//
// Same work items, online softmax and merge as mla_decode_impl.h; what differs is the inner
// arithmetic. Per tile of BT tokens:
//   rows:   each token's [c ; k_r] as bf16. A bf16 cache is read in place (pointers into the
//           cache); int8 / fp8 codes are widened in registers to bf16 *codes* (exact: an int8
//           or an e4m3 value fits bf16's 8-bit significand), into an L1 tile; the token's
//           scale multiplies its latent score and its value weight instead.
//   scores: q (bf16, as the model computed it) . row with vdpbf16ps: bf16 x bf16 products are
//           exact in float32 and summed in float32, so scores are as exact as the float32 path.
//           Three query rows (heads) at a time share each row load, eight tokens per pass share
//           each q load (24 accumulators); a 16-way transpose-add gives 16 scores. Rows whose
//           latent query is zero (an exact conversion's: W_UK all zero) skip the latent's chunks. (One row at a
//           time loaded every latent chunk once per head: 1.7x slower at 8K, in cache.)
//   values: the tile's rows are interleaved in pairs (token 2p, 2p+1) once, for all heads; then
//           for three query rows at a time, acc += (p_2p, p_2p+1) . (c_2p, c_2p+1) with one vdpbf16ps per 16
//           output lanes: two tokens per instruction, the probabilities rounded to bf16 (2^-9
//           relative; the output is bf16 anyway). The pairing permutes output lanes within each
//           32-wide chunk; `unpermute` restores the order at the end of the span.
// Requires kv_rank % 32 == 0, or % 16 == 0 with the latent ending inside a full 32-value chunk
// (mla_attention.cpp decode_loops falls back to the float32 path otherwise).
#include "mla_job.h"
#include "widen_bf16.h"

constexpr int BT = 32;  // tokens per tile: 32 rows of 576 bf16 (36 KB) + their pairs stay in L1/L2

struct Bf16Scratch {
  uint16_t* tile;   // [BT, Dp] widened rows (quantized caches)
  uint16_t* pairs;  // [BT/2, 2r] interleaved pairs
  const uint16_t* zero;  // [Dp] zeros: the rows past the span
};

// A thread's Bf16Scratch, owned: Dp = D rounded up to 32.
struct Bf16Buffers {
  std::vector<uint16_t> tile, pairs, zero;
  Bf16Buffers(int64_t D, int64_t r) : tile(64 * ((D + 31) / 32 * 32) + TC_SLACK), pairs(64 * r), zero((D + 31) / 32 * 32, 0) {}
  Bf16Scratch scratch() { return {tile.data(), pairs.data(), zero.data()}; }
};

// 16 vectors -> one vector of their 16 horizontal sums (lane j = sum of v[j]).
static inline __m512 reduce16(__m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // lanes: (v2i, v2i+1) interleaved partial sums
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // each 128-bit lane: v4i .. v4i+3
    __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: (v8i..+3, v8i+4..+7) x two partials
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

static inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// One row's online-softmax step over a tile: scores sc[0..nv) -> running max/sum updated,
// value weights wt[0..BT) = p_t x tscale_t (0 past nv) in float32; returns alpha (the rescale of
// the row's earlier sums) and sets *wmax to the largest weight.
static inline float softmax_tile(float* sc, int nv, const float* tscale, float* mx, float* sum, float* wt,
                                 float* wmax) {
  const __mmask16 m0 = (__mmask16)(nv >= 16 ? 0xFFFF : (1u << nv) - 1);
  const __mmask16 m1 = (__mmask16)(nv >= 32 ? 0xFFFF : nv > 16 ? (1u << (nv - 16)) - 1 : 0);
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 s0 = _mm512_mask_loadu_ps(ninf, m0, sc), s1 = _mm512_mask_loadu_ps(ninf, m1, sc + 16);
  float tmax = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  float old = *mx, now = tmax > old ? tmax : old;
  float alpha = exp_poly(old - now);  // 1 when the max holds; ~0 from -inf (acc and sum are 0 then)
  *mx = now;
  const __m512 nw = _mm512_set1_ps(now);
  __m512 p0 = _mm512_maskz_mov_ps(m0, exp_poly(_mm512_sub_ps(s0, nw)));
  __m512 p1 = _mm512_maskz_mov_ps(m1, exp_poly(_mm512_sub_ps(s1, nw)));
  *sum = *sum * alpha + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  p0 = _mm512_mul_ps(p0, _mm512_loadu_ps(tscale)), p1 = _mm512_mul_ps(p1, _mm512_loadu_ps(tscale + 16));
  *wmax = _mm512_reduce_max_ps(_mm512_max_ps(p0, p1));
  _mm512_storeu_ps(wt, p0), _mm512_storeu_ps(wt + 16, p1);
  return alpha;
}

// Rows of tokens [j0, j0 + n) as bf16 pointers (in place for a bf16 cache, else widened into
// the scratch tile); rows n..BT-1 point at zeros. tscale[t]: the token's latent scale (1 unless
// quantized). int8 rope codes: with rscale, widened as codes like the latent and their scale put
// in rscale[t] (the caller scales the rope's score part); without, as bf16 values (code x scale
// rounded, as the reference dequantizes them).
static void tile_rows(const Job& job, const int64_t* table, int64_t j0, int n, int Dp, const Bf16Scratch& s,
                      const uint16_t** rows, float* tscale, float* rscale = nullptr) {
  const int D = job.D, r = job.r, dr = job.D - job.r, bs = job.bs;
  const bool quant = job.kind == KIND_I8 || job.kind == KIND_FP8;
  int64_t blk = j0 / bs, off = j0 % bs;  // walked, not divided per token (an idiv each was ~1/3 of the bf16 AMX kernel)
  for (int t = 0; t < BT; ++t) {
    tscale[t] = 1.0f;
    if (rscale) rscale[t] = 1.0f;
    if (t >= n) {
      rows[t] = s.zero;
      continue;
    }
    const int64_t slot = table[blk] * bs + off;
    if (++off == bs) off = 0, ++blk;
    if (quant) tscale[t] = job.scale[slot * job.scale_stride];
    if (job.kind == KIND_BF16) {
      rows[t] = (const uint16_t*)job.kv + slot * D;
      continue;
    }
    uint16_t* dst = s.tile + (int64_t)t * Dp;
    rows[t] = dst;
    if (job.kind == KIND_F32) {
      round_bf16((const float*)job.kv + slot * D, dst, D);
      continue;
    }
    if (job.kind == KIND_TC) {  // values rounded to bf16, as the reference dequantizes into a bf16 model's rows
      const TcLayout& tc = job.tc;
      const uint8_t* codes = (const uint8_t*)job.latent + slot * tc.code_bytes;
      if (tc.n_chunks) {  // 32 columns at a time (tc_chunk32), rounded to bf16 as a run's are
        __m512 m_lo, m_hi, lo, hi;
        tc_group_steps(tc, job.scale16 + slot * tc.groups, m_lo, m_hi);
        const TcChunk* chunks = tc.chunks;
        const int n_chunks = tc.n_chunks;  // (in registers: the stores may alias tc)
        for (int c = 0; c < n_chunks; ++c) {
          tc_chunk32(chunks[c], codes, m_lo, m_hi, lo, hi);
          _mm512_storeu_si512((void*)(dst + 32 * c), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
      } else {
        tc_runs(tc, codes, job.scale16 + slot * tc.groups, [dst](const int32_t* r, const uint8_t* src, float off, float step) {
          // all 16 lanes, unmasked (widen_tc): the tile has TC_SLACK values of room
          _mm256_storeu_si256((__m256i*)(dst + r[4]), (__m256i)_mm512_cvtneps_pbh(tc_run16(src, r[1], r[2], off, step)));
        });
      }
      round_bf16(tc.cs + (j0 + t) * tc.cs_width, dst + tc.values, tc.cs_width);
      continue;
    }
    widen_codes((const char*)job.latent + slot * r, dst, r, job.kind == KIND_FP8);
    if (job.rope_bf16) __builtin_memcpy(dst + r, (const uint16_t*)job.rope + slot * dr, sizeof(uint16_t) * dr);
    else if (job.rope_i8 && rscale) {
      rscale[t] = job.scale[slot * 2 + 1];
      widen_codes((const int8_t*)job.rope + slot * dr, dst + r, dr, false);
    } else if (job.rope_i8) {  // values in bf16 (codes times the token's rope scale), as the reference dequantizes
      scale_codes((const int8_t*)job.rope + slot * dr, job.scale[slot * 2 + 1], dst + r, dr);
    } else
      round_bf16((const float*)job.rope + slot * dr, dst + r, dr);
  }
}

// Prefetch part `part` of `parts` of the rows of tokens [j0, j1) (the next tile) while this one is
// computed, spread over the tile's query rows so that few requests are in flight at once: a span
// jumps to another block every block_size tokens, where the hardware prefetcher stalls (the first
// touch of each row was the kernel's hottest instruction without this).
static inline void prefetch_rows(const Job& job, const int64_t* table, int64_t j0, int64_t j1, int part, int parts) {
  const int bs = job.bs;
  const bool quant = job.kind == KIND_I8 || job.kind == KIND_FP8;
  const int64_t row = job.kind == KIND_TC ? job.tc.code_bytes : quant ? job.r : (int64_t)job.D * (job.kind == KIND_F32 ? 4 : 2);
  const int64_t rope_row = quant ? (int64_t)(job.D - job.r) * (job.rope_i8 ? 1 : job.rope_bf16 ? 2 : 4) : 0;
  const int64_t n = j1 - j0, first = j0 + n * part / parts;
  int64_t blk = first / bs, off = first % bs;
  for (int64_t j = first; j < j0 + n * (part + 1) / parts; ++j) {
    const int64_t slot = table[blk] * bs + off;
    if (++off == bs) off = 0, ++blk;
    const char* p = quant || job.kind == KIND_TC ? (const char*)job.latent + slot * row : (const char*)job.kv + slot * row;
    for (int64_t o = 0; o < row; o += 64) prefetch_l2(p + o);
    if (rope_row) {
      const char* pr = (const char*)job.rope + slot * rope_row;
      for (int64_t o = 0; o < rope_row; o += 64) prefetch_l2(pr + o);
    }
  }
}

// The BT rows' first r values (r % 16 == 0), interleaved by token pair: pairs[p][64k + 0..31] =
// unpacklo / unpackhi of rows 2p and 2p+1 over values 32k..32k+31 (a last 16: the 256-bit ones).
static inline void pair_rows(const uint16_t* const* rows, int r, uint16_t* pairs) {
  for (int p = 0; p < BT / 2; ++p) {
    const uint16_t *a = rows[2 * p], *b = rows[2 * p + 1];
    uint16_t* dst = pairs + (int64_t)p * 2 * r;
    int i = 0;
    for (; i + 32 <= r; i += 32) {
      __m512i x = _mm512_loadu_si512((const void*)(a + i)), y = _mm512_loadu_si512((const void*)(b + i));
      _mm512_storeu_si512((void*)(dst + 2 * i), _mm512_unpacklo_epi16(x, y));
      _mm512_storeu_si512((void*)(dst + 2 * i + 32), _mm512_unpackhi_epi16(x, y));
    }
    if (i < r) {  // r % 32 == 16: a last chunk of 16 values (unpermute's tail order)
      __m256i x = _mm256_loadu_si256((const __m256i*)(a + i)), y = _mm256_loadu_si256((const __m256i*)(b + i));
      _mm256_storeu_si256((__m256i*)(dst + 2 * i), _mm256_unpacklo_epi16(x, y));
      _mm256_storeu_si256((__m256i*)(dst + 2 * i + 16), _mm256_unpackhi_epi16(x, y));
    }
  }
}

// sc[g][0..n) = tscale[t] * (q_g . row[t]) over the first r values + q_g . row[t] over the rest
// (n <= BT) for G query rows q_g = q + g * D at once, chunks c0.. (c0 = r / 32 where the G rows' latent
// parts are all zero: a zero part adds exact zeros, so the sums are the same): each row chunk is
// loaded once for the G rows (G x 8 accumulators), eight tokens per pass. A row's lanes and sums are the same whatever G
// (batch-invariant). r % 16 == 0; where r % 32 == 16 the chunk the latent ends in is a full one (mla_decode's rule).
template <int G>
static inline void scores_bf16(const uint16_t* q, const uint16_t* const* rows, int n, int D, int r, bool scaled,
                               const float* tscale, float* sc, int c0) {
  const int full = D / 32, lat = r / 32;
  const bool mixed = r % 32 != 0;  // chunk lat holds the latent's last 16 values and 16 of the rope (a full chunk)
  const __mmask32 tail = (__mmask32)((1ull << (D % 32)) - 1);
  __m512 acc[G][BT];
  const int groups = (n + 7) / 8;
  for (int g = 0; g < groups; ++g) {
    const uint16_t* const* rw = rows + g * 8;
    __m512 a[G][8];
    for (int k = 0; k < G; ++k)
      for (int i = 0; i < 8; ++i) a[k][i] = _mm512_setzero_ps();
    for (int c = c0; c < full; ++c) {
      if (scaled && c == lat && mixed) {  // latent values 0..15 of the chunk, the scale, then the rope's 16
        for (int part = 0; part < 2; ++part) {
          const __mmask32 lanes = part ? 0xFFFF0000u : 0x0000FFFFu;
          __m512bh qc[G];
          for (int k = 0; k < G; ++k) qc[k] = as_bh(_mm512_maskz_loadu_epi16(lanes, q + k * D + 32 * c));
          for (int i = 0; i < 8; ++i) {
            __m512bh x = as_bh(_mm512_loadu_si512((const void*)(rw[i] + 32 * c)));
            for (int k = 0; k < G; ++k) a[k][i] = _mm512_dpbf16_ps(a[k][i], x, qc[k]);
          }
          if (!part)
            for (int k = 0; k < G; ++k)
              for (int i = 0; i < 8; ++i) a[k][i] = _mm512_mul_ps(a[k][i], _mm512_set1_ps(tscale[g * 8 + i]));
        }
        continue;
      }
      if (scaled && c == lat)
        for (int k = 0; k < G; ++k)
          for (int i = 0; i < 8; ++i) a[k][i] = _mm512_mul_ps(a[k][i], _mm512_set1_ps(tscale[g * 8 + i]));
      __m512bh qc[G];
      for (int k = 0; k < G; ++k) qc[k] = as_bh(_mm512_loadu_si512((const void*)(q + k * D + 32 * c)));
      for (int i = 0; i < 8; ++i) {
        __m512bh x = as_bh(_mm512_loadu_si512((const void*)(rw[i] + 32 * c)));
        for (int k = 0; k < G; ++k) a[k][i] = _mm512_dpbf16_ps(a[k][i], x, qc[k]);
      }
    }
    if (scaled && full == lat)
      for (int k = 0; k < G; ++k)
        for (int i = 0; i < 8; ++i) a[k][i] = _mm512_mul_ps(a[k][i], _mm512_set1_ps(tscale[g * 8 + i]));
    if (tail) {
      __m512bh qc[G];
      for (int k = 0; k < G; ++k) qc[k] = as_bh(_mm512_maskz_loadu_epi16(tail, q + k * D + 32 * full));
      for (int i = 0; i < 8; ++i) {
        __m512bh x = as_bh(_mm512_maskz_loadu_epi16(tail, rw[i] + 32 * full));
        for (int k = 0; k < G; ++k) a[k][i] = _mm512_dpbf16_ps(a[k][i], x, qc[k]);
      }
    }
    for (int k = 0; k < G; ++k)
      for (int i = 0; i < 8; ++i) acc[k][g * 8 + i] = a[k][i];
  }
  for (int k = 0; k < G; ++k) {
    for (int g = groups; g < (groups + 1) / 2 * 2; ++g)
      for (int i = 0; i < 8; ++i) acc[k][g * 8 + i] = _mm512_setzero_ps();
    for (int h = 0; h < groups; h += 2) _mm512_storeu_ps(sc + k * BT + h * 8, reduce16(acc[k] + h * 8));
  }
}

// acc_g [NZ x 16 lanes] = acc_g * alpha_g + sum over the tile's pairs of (w_g pair) . (row pair),
// for G query rows at once: each pair vector is loaded once for the G rows.
template <int G, int NZ>
static inline void values_block(float* const* acc, int off, const uint16_t* pairs, int r, const uint32_t* w,
                                const float* alpha) {
  __m512 a[G][NZ];
  for (int k = 0; k < G; ++k)
    for (int z = 0; z < NZ; ++z) a[k][z] = _mm512_mul_ps(_mm512_loadu_ps(acc[k] + off + 16 * z), _mm512_set1_ps(alpha[k]));
  for (int p = 0; p < BT / 2; ++p) {
    __m512bh wp[G];
    for (int k = 0; k < G; ++k) wp[k] = as_bh(_mm512_set1_epi32((int)w[k * (BT / 2) + p]));
    const uint16_t* src = pairs + (int64_t)p * 2 * r + 2 * off;
    for (int z = 0; z < NZ; ++z) {
      __m512bh v = as_bh(_mm512_loadu_si512((const void*)(src + 32 * z)));
      for (int k = 0; k < G; ++k) a[k][z] = _mm512_dpbf16_ps(a[k][z], v, wp[k]);
    }
  }
  for (int k = 0; k < G; ++k)
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(acc[k] + off + 16 * z, a[k][z]);
}

// G query rows m0 .. m0+G-1 over one tile of n tokens (rows, pairs ready): scores, online softmax
// and values. A row with no visible token here keeps its state exactly (alpha 1, weights 0).
template <int G>
static inline void attend_tile_rows(const Job& job, int m0, int64_t j0, int n, const uint16_t* q, const int64_t* lim,
                                    const uint16_t* const* rows, const float* tscale, const uint16_t* pairs, bool scaled,
                                    const char* lat_zero, float* acc, float* mx, float* sum) {
  const int D = job.D, r = job.r;
  int nv[G], most = 0;
  for (int k = 0; k < G; ++k) {
    int64_t visible = lim[m0 + k] - j0;
    nv[k] = visible <= 0 ? 0 : (visible < n ? (int)visible : n);
    most = nv[k] > most ? nv[k] : most;
  }
  if (most == 0) return;
  bool skip = r % 32 == 0;
  for (int k = 0; k < G; ++k) skip = skip && lat_zero[m0 + k];
  alignas(64) float sc[G * BT];
  scores_bf16<G>(q + (int64_t)m0 * D, rows, most, D, r, scaled, tscale, sc, skip ? r / 32 : 0);
  alignas(64) uint16_t w16[G * BT];
  float alpha[G];
  float* am[G];
  for (int k = 0; k < G; ++k) {
    am[k] = acc + (int64_t)(m0 + k) * r;
    if (nv[k] == 0) {
      alpha[k] = 1.0f;
      for (int t = 0; t < BT; ++t) w16[k * BT + t] = 0;
      continue;
    }
    float wmax, wt[BT];
    alpha[k] = softmax_tile(sc + k * BT, nv[k], tscale, mx + m0 + k, sum + m0 + k, wt, &wmax);
    _mm256_storeu_si256((__m256i*)(w16 + k * BT), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(wt)));
    _mm256_storeu_si256((__m256i*)(w16 + k * BT + 16), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(wt + 16)));
  }
  const uint32_t* w = (const uint32_t*)w16;
  int z = 0;
  const int nz = r / 16;
  for (; z + 4 <= nz; z += 4) values_block<G, 4>(am, 16 * z, pairs, r, w, alpha);
  for (; z + 2 <= nz; z += 2) values_block<G, 2>(am, 16 * z, pairs, r, w, alpha);
  if (z < nz) values_block<G, 1>(am, 16 * z, pairs, r, w, alpha);
}

// Lane q of a 32-wide chunk holds value 8 * ((q % 16) / 4) + 4 * (q / 16) + q % 4 of it; of a last
// 16-wide one (256-bit unpacks), value 4 * {0, 2, 1, 3}[q / 4] + q % 4.
static inline void unpermute(float* acc, int r) {
  // as gathers: value v of a 32-wide chunk sits in lane 16 ((v % 8) / 4) + 4 (v / 8) + v % 4; of a
  // last 16-wide one in lane 4 {0, 2, 1, 3}[v / 4] + v % 4 (vpermt2ps / vpermps: moves, no rounding)
  alignas(64) static const int lo[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static const int hi[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  alignas(64) static const int last[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
  const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
  int i = 0;
  for (; i + 32 <= r; i += 32) {
    const __m512 a = _mm512_loadu_ps(acc + i), b = _mm512_loadu_ps(acc + i + 16);
    _mm512_storeu_ps(acc + i, _mm512_permutex2var_ps(a, ilo, b));
    _mm512_storeu_ps(acc + i + 16, _mm512_permutex2var_ps(a, ihi, b));
  }
  if (i < r) _mm512_storeu_ps(acc + i, _mm512_permutexvar_ps(_mm512_load_si512(last), _mm512_loadu_ps(acc + i)));
}

// One item as attend_span (mla_decode_impl.h) with q bf16 [M, D]; writes acc [M, r] (in order), mx, sum.
static void attend_span_bf16(const Job& job, int64_t b, int64_t t0, int64_t t1, const uint16_t* q,
                             const int64_t* lim, float* acc, float* mx, float* sum, const Bf16Scratch& s) {
  const int M = job.M, D = job.D, r = job.r, Dp = (D + 31) / 32 * 32;
  const int64_t* table = job.block_tables + b * job.nb;
  for (int m = 0; m < M; ++m) mx[m] = -__builtin_inff(), sum[m] = 0.0f;
  for (int64_t i = 0; i < (int64_t)M * r; ++i) acc[i] = 0.0f;
  const uint16_t* rows[BT];
  float tscale[BT];
  const bool scaled = job.kind == KIND_I8 || job.kind == KIND_FP8;
  // rows whose latent query is zero (an exact conversion's: W_UK all zero) score the rope part alone
  std::vector<char> lat_zero(M);
  for (int m = 0; m < M; ++m) {
    uint16_t bits = 0;
    for (int i = 0; i < r; ++i) bits |= q[(int64_t)m * D + i] & 0x7FFFu;  // +-0 alike
    lat_zero[m] = bits == 0;
  }
  for (int64_t j0 = t0; j0 < t1; j0 += BT) {
    int n = (int)(t1 - j0 < BT ? t1 - j0 : BT);
    const int64_t p0 = j0 + BT, p1 = j0 + 2 * BT < t1 ? j0 + 2 * BT : t1;  // the next tile
    tile_rows(job, table, j0, n, Dp, s, rows, tscale);
    pair_rows(rows, r, s.pairs);
    // query rows three at a time (the bundled model's 9 heads: three groups), the rest one by one
    const int groups = M / 3;
    for (int g = 0; g < groups; ++g) {
      prefetch_rows(job, table, p0, p1, g, groups + M % 3);
      attend_tile_rows<3>(job, 3 * g, j0, n, q, lim, rows, tscale, s.pairs, scaled, lat_zero.data(), acc, mx, sum);
    }
    for (int m = 3 * groups; m < M; ++m) {
      prefetch_rows(job, table, p0, p1, groups + m - 3 * groups, groups + M % 3);
      attend_tile_rows<1>(job, m, j0, n, q, lim, rows, tscale, s.pairs, scaled, lat_zero.data(), acc, mx, sum);
    }
  }
  for (int m = 0; m < M; ++m) unpermute(acc + (int64_t)m * r, r);
}
