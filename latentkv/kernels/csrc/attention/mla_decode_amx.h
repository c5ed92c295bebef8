// Paged MLA decode with its scores and value sums on AMX tiles (TDPBF16PS), for bf16 queries on CPUs with
// amx_bf16 (cpu_isa.h). Included by attention_amx_bf16.cpp (and attention_amx_int8.cpp) inside its namespace
// after mla_decode_bf16.h (tile_rows, pair_rows, unpermute, prefetch_rows) and
// amx_tiles.h; its functions run only on the amx_bf16 path (mla_attention.cpp decode_loops).
//
// Same work items and merge as mla_decode_bf16.h; within an item, chunks of AMX_CHUNK tokens in
// two passes (value sums stored, reloaded and rescaled every 32 tokens and one dependent chain of
// products per score tile cost ~1/6 of the kernel at 32 sequences x 384):
//   pass 1, per tile of BT tokens: S^T = K . Q^T for both halves (16 tokens each) as two
//           independent accumulator chains, the keys as the A tiles (16 tokens x 32 values, read
//           where they lie: the cache rows in place for a bf16 cache, the widened tile otherwise)
//           and the group's query rows (up to 16: heads folded into the tile's columns) as the B
//           tiles, packed once per call (pack_queries). Every step is 32 values wide: a last
//           D % 32 values are read as the row's last 32, their query's first values zero (counted
//           in the step before). For an int8 / fp8 latent the latent and rope parts sum in
//           separate C tiles (their steps taken in turns: four chains) and s = scale_t * lat +
//           rope_scale_t * rope (int8 rope codes are widened as codes, like the latent). A tile's
//           rows are widened while the tile before it is scored (tile loads never wait on stores
//           still in flight) and paired for the value products (pair_rows) into the chunk's
//           buffer while they are in L1.
//   softmax: over the chunk's S^T: lanes are query rows, one vector per token, so the max and
//           sum need no horizontal reductions; the chunk's weights as bf16 pairs, transposed to
//           A tiles (rows x pairs of tokens).
//   pass 2: O = W . V summed over the whole chunk in C tiles (4 column blocks of 16 values at a
//           time), stored once; acc = acc * alpha + O once per chunk (unpermute fixes the lane
//           order of pair_rows at the end).
// A row's bits depend only on its query, its position and the keys: each C element is one tile
// lane's sum in the instruction's order over the steps, never on the other rows, the item or the
// thread (batch-invariant; another order than mla_decode_bf16.h's, checked against the scalar path).
#include "mla_job.h"

constexpr int AMX_DECODE_ROWS = 16;  // query rows per group: one tile's columns
constexpr int AMX_CHUNK = 128;       // tokens per softmax step: their scores, weights and pairs stay in L2

static_assert(BT == 32, "one A tile of value weights (16 pairs of tokens) per tile");
static_assert(AMX_CHUNK % BT == 0, "whole tiles per chunk");

struct AmxDecodeScratch {
  std::vector<float> st_lat, st_rope, tscale, rscale;  // [AMX_CHUNK][16] score C tiles as stored; [AMX_CHUNK] token scales (latent, rope)
  std::vector<uint32_t> wt, w;        // one tile's weight pairs wt [BT/2][16] (lanes = rows); w [tiles][16 rows][16 pairs]
  std::vector<uint16_t> pairs;        // [AMX_CHUNK/2][2r]: pair_rows of every tile of the chunk
  std::vector<float> pv;              // [16][r]: the value C tiles as stored
  std::vector<uint16_t> keys;         // [2][16][Dp]: half-tiles of rows copied where they are not evenly spaced
  std::vector<__mmask16> vis;         // [AMX_CHUNK]: the lanes that see each token
  AmxDecodeScratch(int D, int r)
      : st_lat(AMX_CHUNK * 16), st_rope(AMX_CHUNK * 16), tscale(AMX_CHUNK), rscale(AMX_CHUNK), wt(BT * 8), w(AMX_CHUNK * 8),
        pairs((size_t)AMX_CHUNK * r), pv((size_t)16 * r), keys((size_t)32 * ((D + 31) / 32 * 32)), vis(AMX_CHUNK) {}
};

// A thread's scratch for the AMX decodes' items (mla_decode_run.h run_items' S, mla_paths.h DecodeWork):
// the bf16 rows and pairs and the chunk's buffers; its tiles configured before its first item and
// released after its last. Tiles: amx_tiles.h amx_configure's, every one 16 rows x 64 bytes (no step
// has a narrower shape: see amx_tiles.h amx_step_offset).
struct AmxThreadScratch : Bf16Buffers {
  AmxDecodeScratch amx;
  explicit AmxThreadScratch(const DecodeWork& w) : Bf16Buffers(w.D, w.r), amx((int)w.D, (int)w.r) { amx_configure(); }
  ~AmxThreadScratch() { _tile_release(); }
};

// Scores reduce over the D values of a row in amx_tiles.h's steps (amx_steps, amx_step_offset).
static inline int64_t amx_query_block(int D) { return (int64_t)amx_steps(D) * 256; }

// The B tiles of every sequence's query rows q [B, M, D], packed once per call: for sequence b,
// group m0 / 16 and part (0: all values, or the latent's where split; 1: the rope's where split),
// a block of steps x [16 pairs][16 rows] words: step c's pair p holds (q[m][o], q[m][o + 1]),
// o = amx_step_offset(c) + 2p, where o is new to step c (o >= 32c) and in the part; zero elsewhere
// and for rows past M. A step that has no value of the part is left as it is (never read: see
// amx_tile_scores). Each step: the group's rows' 16 words as a 16 x 16 block, transposed.
static void pack_queries(const uint16_t* q, int64_t B, int M, int D, int r, bool split, uint32_t* out, int threads) {
  const int groups = (M + AMX_DECODE_ROWS - 1) / AMX_DECODE_ROWS, parts = split ? 2 : 1;
  const int64_t block = amx_query_block(D);
  const int steps = amx_steps(D);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bg = 0; bg < B * groups; ++bg) {
    const int64_t b = bg / groups;
    const int m0 = (int)(bg % groups) * AMX_DECODE_ROWS, G = M - m0 < AMX_DECODE_ROWS ? M - m0 : AMX_DECODE_ROWS;
    alignas(64) uint32_t words[16][16];
    for (int part = 0; part < parts; ++part) {
      uint32_t* dst = out + (bg * parts + part) * block;
      const int lo = split && part ? r / 2 : 0, hi = split && !part ? r / 2 : D / 2;  // the part's words
      for (int c = 0; c < steps; ++c) {
        const int base = amx_step_offset(c, D) / 2, first = 16 * c > lo ? 16 * c : lo;  // new to the step, in the part
        if (first >= hi || base + 16 <= first) continue;
        uint32_t lanes = 0;
        for (int p = 0; p < 16; ++p) lanes |= (uint32_t)(base + p >= first && base + p < hi) << p;
        for (int g = 0; g < 16; ++g)
          _mm512_store_si512(words[g], g < G ? _mm512_maskz_loadu_epi32((__mmask16)lanes, q + (b * M + m0 + g) * D + 2 * base)
                                             : _mm512_setzero_si512());
        transpose16(&words[0][0], 16, dst + (int64_t)c * 256, 16);
      }
    }
  }
}

// The 16 rows of a half-tile as one A operand: their base and stride (in values) when evenly
// spaced, else copied into `keys` [16][Dp] (rows past the span are zero rows already: s.zero).
static inline const uint16_t* half_rows(const uint16_t* const* rows, int D, int Dp, uint16_t* keys, int64_t* stride) {
  const int64_t d = rows[1] - rows[0];
  bool even = d > 0;
  for (int t = 2; t < 16 && even; ++t) even = rows[t] - rows[t - 1] == d;
  if (even) {
    *stride = d;
    return rows[0];
  }
  for (int t = 0; t < 16; ++t) std::memcpy(keys + (int64_t)t * Dp, rows[t], (size_t)D * 2);
  *stride = Dp;
  return keys;
}

// S^T of a tile for one row group: st_lat [32][16] (and st_rope where split) from the keys of its
// two halves k0, k1 (k1 null: 16 tokens or fewer). Two accumulator chains (one per half) per
// part; an unsplit score alternates its A / B tiles by step so a load never waits for a product
// still reading that tile.
#define AMX_SCORE_PAIR(TA0, TA1, TB)            \
  do {                                          \
    _tile_loadd(TA0, k0 + off, ld0);            \
    if (k1) _tile_loadd(TA1, k1 + off, ld1);    \
    _tile_loadd(TB, q_lat + c * 256, 64);       \
    _tile_dpbf16ps(0, TA0, TB);                 \
    if (k1) _tile_dpbf16ps(1, TA1, TB);         \
  } while (0)
static inline void amx_tile_scores(const uint16_t* k0, int64_t s0, const uint16_t* k1, int64_t s1, int D, int r,
                                   bool split, const uint32_t* q_lat, const uint32_t* q_rope, float* st_lat,
                                   float* st_rope) {
  const int steps = amx_steps(D), ld0 = (int)s0 * 2, ld1 = (int)s1 * 2;
  _tile_zero(0);
  _tile_zero(1);
  if (split) {  // C 0 / 1: latent of each half; 2 / 3: rope; A 4 / 5; B 6 (latent's query), 7 (rope's)
    _tile_zero(2);
    _tile_zero(3);
    // the latent's steps and the rope's taken in turns: four accumulator chains in flight, not two
    const int nlat = (r + 31) / 32, rope0 = r / 32, nrope = steps - rope0;
    for (int i = 0; i < nlat || i < nrope; ++i) {
      for (int part = 0; part < 2; ++part) {
        const int c = part ? rope0 + i : i;
        if (part ? i >= nrope : i >= nlat) continue;
        const int off = amx_step_offset(c, D);
        const bool lat = 32 * c < r, rope = 32 * c + 32 > r;
        if (part && lat) continue;  // the step both parts share (r % 32 != 0): taken in the latent's turn
        _tile_loadd(4, k0 + off, ld0);
        if (k1) _tile_loadd(5, k1 + off, ld1);
        if (lat) {
          _tile_loadd(6, q_lat + c * 256, 64);
          _tile_dpbf16ps(0, 4, 6);
          if (k1) _tile_dpbf16ps(1, 5, 6);
        }
        if (rope) {
          _tile_loadd(7, q_rope + c * 256, 64);
          _tile_dpbf16ps(2, 4, 7);
          if (k1) _tile_dpbf16ps(3, 5, 7);
        }
      }
    }
    _tile_stored(2, st_rope, 64);
    if (k1) _tile_stored(3, st_rope + 256, 64);
  } else {
    for (int c = 0; c < steps; ++c) {
      const int off = amx_step_offset(c, D);
      if (c & 1) AMX_SCORE_PAIR(5, 6, 7);
      else AMX_SCORE_PAIR(2, 3, 4);
    }
  }
  _tile_stored(0, st_lat, 64);
  if (k1) _tile_stored(1, st_lat + 256, 64);
}
#undef AMX_SCORE_PAIR

// pv [16][r] = sum over the chunk's tiles of w_k [16 rows][16 pairs] . pairs_k ([16 pairs][r x 2],
// pair_rows' layout), in C tiles over every tile of the chunk, stored once (amx_tiles.h).
static inline void amx_chunk_values(const uint32_t* w, const uint16_t* pairs, int tiles, int r, float* pv) {
  amx_sum_blocks(
      tiles, r / 16, [&](int k) { return w + k * 256; }, 64, [&](int k) { return pairs + (int64_t)k * BT * r; }, r * 4,
      pv, r);
}

// One item's row groups over its chunks of AMX_CHUNK tokens (acc [M, r] in order, mx, sum as
// attend_span, mla_decode_impl.h): pass1(m0, c0, nt, tiles) fills the chunk's scores a.st_lat [t][16]
// (final: every scale applied), a.tscale (the value weight's scale: 1 unless `scaled`) and the pairs
// a.pairs; then the online softmax over the chunk and its value sums on tiles (pass 2).
template <class Pass1>
static inline void amx_item(const Job& job, int64_t t0, int64_t t1, const int64_t* lim, bool scaled, float* acc,
                            float* mx, float* sum, AmxDecodeScratch& a, Pass1 pass1) {
  const int M = job.M, r = job.r;
  for (int64_t i = 0; i < (int64_t)M * r; ++i) acc[i] = 0.0f;
  for (int m0 = 0; m0 < M; m0 += AMX_DECODE_ROWS) {
    const int G = M - m0 < AMX_DECODE_ROWS ? M - m0 : AMX_DECODE_ROWS;
    const __mmask16 rows_g = (__mmask16)((1u << G) - 1);
    // per lane g: the tokens it sees from t0 on (lim is absolute), its running max and sum
    alignas(64) int64_t lim_g[16];
    for (int g = 0; g < 16; ++g) lim_g[g] = g < G ? lim[m0 + g] - t0 : 0;
    const __m512i nvis = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi64_epi32(_mm512_load_si512(lim_g))),
                                      _mm512_cvtsepi64_epi32(_mm512_load_si512(lim_g + 8)), 1);
    __m512 mxv = _mm512_set1_ps(-__builtin_inff()), sumv = _mm512_setzero_ps();
    for (int64_t c0 = t0; c0 < t1; c0 += AMX_CHUNK) {
      const int nt = (int)(t1 - c0 < AMX_CHUNK ? t1 - c0 : AMX_CHUNK), tiles = (nt + BT - 1) / BT;
      const __m512i base = _mm512_set1_epi32((int)(c0 - t0));
      // lanes that see a token of this chunk; none: the group is done with this item
      const __mmask16 any = _mm512_mask_cmpgt_epi32_mask(rows_g, nvis, base);
      if (!any) break;
      pass1(m0, c0, nt, tiles);
      // softmax over the chunk: token t is visible to lane g where t < nvis[g] - (c0 - t0)
      __m512 tmax = _mm512_set1_ps(-__builtin_inff());
      for (int t = 0; t < tiles * BT; ++t) {
        const __mmask16 v = t < nt ? _mm512_mask_cmpgt_epi32_mask(rows_g, nvis, _mm512_add_epi32(base, _mm512_set1_epi32(t))) : 0;
        a.vis[t] = v;
        if (v) tmax = _mm512_mask_max_ps(tmax, v, tmax, _mm512_loadu_ps(a.st_lat.data() + t * 16));
      }
      const __m512 now = _mm512_mask_max_ps(mxv, any, mxv, tmax);
      // alpha: 1 for lanes that see nothing here (their state stays exactly as it was)
      const __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), any, exp_poly(_mm512_sub_ps(mxv, now)));
      mxv = now;
      __m512 tot0 = _mm512_setzero_ps(), tot1 = _mm512_setzero_ps();
      for (int k = 0; k < tiles; ++k) {
        for (int t = k * BT; t < (k + 1) * BT; t += 2) {
          __m512 w0 = _mm512_setzero_ps(), w1 = _mm512_setzero_ps();
          if (a.vis[t]) {
            w0 = _mm512_maskz_mov_ps(a.vis[t], exp_poly(_mm512_sub_ps(_mm512_loadu_ps(a.st_lat.data() + t * 16), now)));
            tot0 = _mm512_add_ps(tot0, w0);
            if (scaled) w0 = _mm512_mul_ps(w0, _mm512_set1_ps(a.tscale[t]));
          }
          if (a.vis[t + 1]) {
            w1 = _mm512_maskz_mov_ps(a.vis[t + 1], exp_poly(_mm512_sub_ps(_mm512_loadu_ps(a.st_lat.data() + (t + 1) * 16), now)));
            tot1 = _mm512_add_ps(tot1, w1);
            if (scaled) w1 = _mm512_mul_ps(w1, _mm512_set1_ps(a.tscale[t + 1]));
          }
          _mm512_storeu_si512(a.wt.data() + ((t - k * BT) / 2) * 16, pair_words(w0, w1));  // lane g: (w_t[g], w_t+1[g])
        }
        transpose16(a.wt.data(), 16, a.w.data() + k * 256, 16);
      }
      sumv = _mm512_fmadd_ps(sumv, alpha, _mm512_add_ps(tot0, tot1));
      // pass 2: the chunk's value sums, then acc = acc * alpha + pv (one rounding)
      amx_chunk_values(a.w.data(), a.pairs.data(), tiles, r, a.pv.data());
      alignas(64) float al[16];
      _mm512_store_ps(al, alpha);
      for (int g = 0; g < G; ++g) {
        const __m512 ag = _mm512_set1_ps(al[g]);
        float* o = acc + (int64_t)(m0 + g) * r;
        const float* pv = a.pv.data() + (int64_t)g * r;
        for (int d = 0; d < r; d += 16)
          _mm512_storeu_ps(o + d, _mm512_fmadd_ps(_mm512_loadu_ps(o + d), ag, _mm512_loadu_ps(pv + d)));
      }
    }
    alignas(64) float mo[16], so[16];
    _mm512_store_ps(mo, mxv);
    _mm512_store_ps(so, sumv);
    for (int g = 0; g < G; ++g) mx[m0 + g] = mo[g], sum[m0 + g] = so[g];
  }
  for (int m = 0; m < M; ++m) unpermute(acc + (int64_t)m * r, r);
}

// One item as attend_span (mla_decode_impl.h) with q bf16 [M, D]; writes acc [M, r] (in order), mx, sum.
// qpack: the sequence's blocks from pack_queries.
static void attend_span_amx(const Job& job, int64_t b, int64_t t0, int64_t t1, const uint32_t* qpack, const int64_t* lim,
                            float* acc, float* mx, float* sum, const Bf16Scratch& s, AmxDecodeScratch& a) {
  const int D = job.D, r = job.r, Dp = (D + 31) / 32 * 32;
  const int64_t* table = job.block_tables + b * job.nb;
  const bool split = job.kind == KIND_I8 || job.kind == KIND_FP8;  // latent codes scaled per token
  // Two tiles of rows: tile k + 1 is widened before tile k's scores, so the tile loads never read
  // rows whose stores are still in flight (s.tile holds 2 x BT rows).
  const uint16_t* rows_buf[2][BT];
  const Bf16Scratch half[2] = {s, {s.tile + (int64_t)BT * Dp, s.pairs, s.zero}};
  amx_item(job, t0, t1, lim, split, acc, mx, sum, a, [&](int m0, int64_t c0, int nt, int tiles) {
    const uint32_t* q_lat = qpack + (int64_t)(m0 / AMX_DECODE_ROWS) * (split ? 2 : 1) * amx_query_block(D);
    const uint32_t* q_rope = q_lat + amx_query_block(D);
    // scores and pairs, tile by tile (the rows after the next tile's prefetched meanwhile)
    auto widen = [&](int k) {
      const int64_t j0 = c0 + (int64_t)k * BT;
      tile_rows(job, table, j0, (int)(c0 + nt - j0 < BT ? c0 + nt - j0 : BT), Dp, half[k & 1], rows_buf[k & 1],
                a.tscale.data() + k * BT, a.rscale.data() + k * BT);
    };
    widen(0);
    for (int k = 0; k < tiles; ++k) {
      const int64_t j0 = c0 + (int64_t)k * BT;
      const int n = (int)(c0 + nt - j0 < BT ? c0 + nt - j0 : BT);
      const uint16_t* const* rows = rows_buf[k & 1];
      if (k + 1 < tiles) widen(k + 1);
      const int64_t p0 = j0 + (k + 1 < tiles ? 2 : 1) * BT, p1 = p0 + BT < t1 ? p0 + BT : t1;  // the next tile not widened yet
      // a bf16 cache's rows are left to the hardware prefetcher: a block's rows lie in one run of
      // bs x D x 2 bytes, and software prefetches only held fill buffers (one thread, a call at V3's
      // shape, 32 x 4,096: 30-31 against 34-35 ms; 9 heads of 192 + 192, 32 x 1,024: 3.9 against 4.7 ms)
      const bool ahead = job.kind != KIND_BF16;
      if (ahead) prefetch_rows(job, table, p0, p1, 0, 2);
      int64_t s0, s1 = 0;
      const uint16_t* k0 = half_rows(rows, D, Dp, a.keys.data(), &s0);
      const uint16_t* k1 = n > 16 ? half_rows(rows + 16, D, Dp, a.keys.data() + 16 * Dp, &s1) : nullptr;
      float *st = a.st_lat.data() + k * BT * 16, *sr = a.st_rope.data() + k * BT * 16;
      amx_tile_scores(k0, s0, k1, s1, D, r, split, q_lat, q_rope, st, sr);
      if (split)  // s = scale_t * lat + rope_scale_t * rope
        for (int t = 0; t < n; ++t)
          _mm512_storeu_ps(st + t * 16, _mm512_fmadd_ps(_mm512_loadu_ps(st + t * 16), _mm512_set1_ps(a.tscale[k * BT + t]),
                                                        _mm512_mul_ps(_mm512_loadu_ps(sr + t * 16), _mm512_set1_ps(a.rscale[k * BT + t]))));
      if (ahead) prefetch_rows(job, table, p0, p1, 1, 2);  // in halves: all at once stalled on the fill buffers
      pair_rows(rows, r, a.pairs.data() + (int64_t)k * BT * r);
    }
  });
}
