// Paged MLA decode with its scores and value sums on AMX tiles (TDPBF16PS), for bf16 queries on CPUs with
// amx_bf16 (cpu_isa.h's code 4). Included by mla_attention.cpp inside `namespace isa_avx512bf16`
// after mla_decode_bf16.h (tile_rows, pair_rows, unpermute, prefetch_rows) and
// amx_tiles.h; its functions run only on isa 4.
//
// Same work items, tiles of BT tokens and merge as mla_decode_bf16.h; what differs:
//   scores: S^T = K . Q^T with the keys as the A tiles (16 tokens x 32 values, read where they lie:
//           the cache rows in place for a bf16 cache, the widened tile otherwise) and the group's
//           query rows (up to 16: heads folded into the tile's columns) as the B tiles, packed once
//           per call as bf16 pairs (pack_queries). For an int8 / fp8 latent the latent and rope parts sum in two C
//           tiles (the query packed twice, each part's values zeroed in the other), the token's scale
//           applied to the latent sum: s = scale_t * lat + rope.
//   softmax: over S^T as it comes out of the tiles: lanes are query rows, one vector per token, so
//           the running max and sum need no horizontal reductions.
//   values: O = W . V on tiles: the weights (bf16 pairs of tokens, transposed to rows x pairs) as A,
//           the rows interleaved by pair_rows as B (16 values a tile, in its lane order; unpermute
//           puts them back at the end), acc = acc * alpha + O in one rounding.
// A row's bits depend only on its query, its position and the keys: each C element is one tile
// lane's sum in the instruction's order over the steps, never on the other rows, the item or the
// thread (batch-invariant; another order than mla_decode_bf16.h's, checked against the scalar path).
#include "mla_job.h"

constexpr int AMX_DECODE_ROWS = 16;  // query rows per group: one tile's columns

static_assert(BT == 32, "one A tile of value weights (16 pairs of tokens) per tile");

struct AmxDecodeScratch {
  std::vector<float> st_lat, st_rope;  // [BT][16]: the score C tiles as stored
  std::vector<uint32_t> wt, w;         // value weights as bf16 pairs: wt [BT/2][16] (lanes = rows), w its transpose
  std::vector<float> pv;               // [16][r]: the value C tiles as stored
  std::vector<uint16_t> keys;          // [16][Dp]: a half-tile of rows copied where they are not evenly spaced
  AmxDecodeScratch(int D, int r)
      : st_lat(BT * 16), st_rope(BT * 16), wt(BT * 8), w(BT * 8), pv((size_t)16 * r),
        keys((size_t)16 * ((D + 31) / 32 * 32)) {}
};

// pv [16][r] = w [16 rows][16 pairs of tokens] . pairs ([16 pairs][r values x 2], pair_rows' layout):
// 16 values per C tile, their lanes in pair_rows' order (as values_block's). Tiles: A 2, B 4 / 6, C 0 / 1 / 3.
#define AMX_PV(C, B, z)                                   \
  do {                                                    \
    _tile_zero(C);                                        \
    _tile_loadd(B, pairs + 32 * (z), ld);                 \
    _tile_dpbf16ps(C, 2, B);                              \
    _tile_stored(C, pv + 16 * (z), r * 4);                \
  } while (0)
static inline void amx_decode_values(const uint32_t* w, const uint16_t* pairs, int r, float* pv) {
  const int nz = r / 16, ld = r * 4;
  _tile_loadd(2, w, 64);
  int z = 0;
  for (; z + 3 <= nz; z += 3) {
    AMX_PV(0, 4, z);
    AMX_PV(1, 6, z + 1);
    AMX_PV(3, 4, z + 2);
  }
  for (; z < nz; ++z) AMX_PV(0, 6, z);
}
#undef AMX_PV

// Tiles 0-1: C (latent, rope); 2-3: A (keys, alternating steps); 4, 6: B (queries, alternating);
// 5 / 7: the A / B tiles of a last step of D % 32 values (dpairs = (D % 32) / 2 pairs).
static inline void amx_decode_configure(int D) {
  AmxTileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  const int tail = D % 32;
  if (tail) cfg.colsb[5] = (uint16_t)(tail * 2), cfg.rows[7] = (uint8_t)(tail / 2);
  amx_load_config(cfg);
}

static void amx_decode_release() { _tile_release(); }

// The B tiles of every sequence's query rows q [B, M, D], packed once per call: for sequence b,
// group m0 / 16 and part (0: all values, or the latent's where split; 1: the rope's where split),
// a block of `steps` x [16 pairs][16 rows] words: (q[m][32s + 2p], q[m][32s + 2p + 1]) for the values
// of the part (D and r even), zero elsewhere and for rows past M.
static inline int64_t amx_query_block(int D) { return (int64_t)(D + 31) / 32 * 256; }

static void pack_queries(const uint16_t* q, int64_t B, int M, int D, int r, bool split, uint32_t* out, int threads) {
  const int groups = (M + AMX_DECODE_ROWS - 1) / AMX_DECODE_ROWS, parts = split ? 2 : 1;
  const int64_t block = amx_query_block(D);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bg = 0; bg < B * groups; ++bg) {
    const int64_t b = bg / groups;
    const int m0 = (int)(bg % groups) * AMX_DECODE_ROWS;
    for (int part = 0; part < parts; ++part) {
      uint32_t* dst = out + (bg * parts + part) * block;
      std::fill(dst, dst + block, 0u);
      const int lo = split && part ? r : 0, hi = split && !part ? r : D;
      for (int g = 0; g < AMX_DECODE_ROWS && m0 + g < M; ++g) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(q + (b * M + m0 + g) * D);
        for (int w = lo / 2; w < hi / 2; ++w) dst[(int64_t)w * 16 + g] = row[w];
      }
    }
  }
}

// The 16 rows of a half-tile as one A operand: their base and stride (in values) when evenly
// spaced, else copied into s.keys (rows past the span are zero rows already: s.zero).
static inline const uint16_t* half_rows(const uint16_t* const* rows, int D, int Dp, AmxDecodeScratch& s, int64_t* stride) {
  const int64_t d = rows[1] - rows[0];
  bool even = d > 0;
  for (int t = 2; t < 16 && even; ++t) even = rows[t] - rows[t - 1] == d;
  if (even) {
    *stride = d;
    return rows[0];
  }
  for (int t = 0; t < 16; ++t) std::memcpy(s.keys.data() + (int64_t)t * Dp, rows[t], (size_t)D * 2);
  *stride = Dp;
  return s.keys.data();
}

// One step c of S^T: keys into A tile TA, the latent / rope queries through B tiles TL / TR (tile
// numbers are immediates: the steps alternate tiles so a load never waits for a product reading it).
#define AMX_SCORE_STEP(TA, TL, TR)                  \
  do {                                              \
    _tile_loadd(TA, a, ld);                         \
    if (lat) {                                      \
      _tile_loadd(TL, q_lat + c * 256, 64);         \
      _tile_dpbf16ps(0, TA, TL);                    \
    }                                               \
    if (rope) {                                     \
      _tile_loadd(TR, q_rope + c * 256, 64);        \
      _tile_dpbf16ps(1, TA, TR);                    \
    }                                               \
  } while (0)

// S^T of one half-tile (16 tokens) for one row group: st_lat [16][16] (and st_rope where split).
static inline void amx_decode_scores(const uint16_t* k, int64_t stride, int D, int r, bool split,
                                     const uint32_t* q_lat, const uint32_t* q_rope, float* st_lat, float* st_rope) {
  const int full = D / 32, ld = (int)stride * 2;
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < full; ++c) {
    const uint16_t* a = k + 32 * c;
    const bool lat = !split || 32 * c < r, rope = split && 32 * c + 32 > r;  // unsplit: one sum in C 0
    if (c & 1) AMX_SCORE_STEP(3, 6, 4);
    else AMX_SCORE_STEP(2, 4, 6);
  }
  if (D % 32) {  // a last step of D % 32 values
    _tile_loadd(5, k + 32 * full, ld);
    if (!split || 32 * full < r) {
      _tile_loadd(7, q_lat + full * 256, 64);
      _tile_dpbf16ps(0, 5, 7);
    }
    if (split) {
      _tile_loadd(7, q_rope + full * 256, 64);
      _tile_dpbf16ps(1, 5, 7);
    }
  }
  _tile_stored(0, st_lat, 64);
  if (split) _tile_stored(1, st_rope, 64);
}
#undef AMX_SCORE_STEP

// One item as attend_span (mla_decode_impl.h) with q bf16 [M, D]; writes acc [M, r] (in order), mx, sum.
// qpack: the sequence's blocks from pack_queries.
static void attend_span_amx(const Job& job, int64_t b, int64_t t0, int64_t t1, const uint32_t* qpack, const int64_t* lim,
                            float* acc, float* mx, float* sum, const Bf16Scratch& s, AmxDecodeScratch& a) {
  const int M = job.M, D = job.D, r = job.r, Dp = (D + 31) / 32 * 32;
  const int64_t* table = job.block_tables + b * job.nb;
  const bool split = job.kind == KIND_I8 || job.kind == KIND_FP8;  // latent codes scaled per token
  for (int64_t i = 0; i < (int64_t)M * r; ++i) acc[i] = 0.0f;
  const uint16_t* rows[BT];
  float tscale[BT];
  for (int m0 = 0; m0 < M; m0 += AMX_DECODE_ROWS) {
    const int G = M - m0 < AMX_DECODE_ROWS ? M - m0 : AMX_DECODE_ROWS;
    const __mmask16 rows_g = (__mmask16)((1u << G) - 1);
    const uint32_t* q_lat = qpack + (int64_t)(m0 / AMX_DECODE_ROWS) * (split ? 2 : 1) * amx_query_block(D);
    const uint32_t* q_rope = q_lat + amx_query_block(D);
    // per lane g: the tokens it sees from t0 on (lim is absolute), its running max and sum
    alignas(64) int64_t lim_g[16];
    for (int g = 0; g < 16; ++g) lim_g[g] = g < G ? lim[m0 + g] - t0 : 0;
    const __m512i nvis = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi64_epi32(_mm512_load_si512(lim_g))),
                                      _mm512_cvtsepi64_epi32(_mm512_load_si512(lim_g + 8)), 1);
    __m512 mxv = _mm512_set1_ps(-__builtin_inff()), sumv = _mm512_setzero_ps();
    float* am[AMX_DECODE_ROWS];
    for (int g = 0; g < G; ++g) am[g] = acc + (int64_t)(m0 + g) * r;
    for (int64_t j0 = t0; j0 < t1; j0 += BT) {
      const int n = (int)(t1 - j0 < BT ? t1 - j0 : BT);
      const int64_t p0 = j0 + BT, p1 = j0 + 2 * BT < t1 ? j0 + 2 * BT : t1;  // the next tile
      const __m512i base = _mm512_set1_epi32((int)(j0 - t0));
      // lanes that see a token of this tile; none: the group is done with this item
      const __mmask16 any = _mm512_mask_cmpgt_epi32_mask(rows_g, nvis, base);
      if (!any) break;
      tile_rows(job, table, j0, n, Dp, s, rows, tscale);
      prefetch_rows(job, table, p0, p1, 0, 2);
      for (int h = 0; h * 16 < n; ++h) {  // the tile loads are the rows' first touch: many lines in flight
        int64_t stride;
        const uint16_t* k = half_rows(rows + 16 * h, D, Dp, a, &stride);
        amx_decode_scores(k, stride, D, r, split, q_lat, q_rope, a.st_lat.data() + h * 256, a.st_rope.data() + h * 256);
      }
      prefetch_rows(job, table, p0, p1, 1, 2);
      pair_rows(rows, r, s.pairs);
      // softmax over the tile: token t is visible to lane g where t < nvis[g] - (j0 - t0)
      __m512 sc[BT];
      __mmask16 vis[BT];
      __m512 tmax = _mm512_set1_ps(-__builtin_inff());
      for (int t = 0; t < BT; ++t) {
        vis[t] = t < n ? _mm512_mask_cmpgt_epi32_mask(rows_g, nvis, _mm512_add_epi32(base, _mm512_set1_epi32(t))) : 0;
        if (!vis[t]) continue;
        __m512 v = _mm512_loadu_ps(a.st_lat.data() + t * 16);
        if (split) v = _mm512_fmadd_ps(v, _mm512_set1_ps(tscale[t]), _mm512_loadu_ps(a.st_rope.data() + t * 16));
        sc[t] = v;
        tmax = _mm512_mask_max_ps(tmax, vis[t], tmax, v);
      }
      const __m512 now = _mm512_mask_max_ps(mxv, any, mxv, tmax);
      // alpha: 1 for lanes that see nothing here (their state stays exactly as it was)
      const __m512 alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), any, exp_poly(_mm512_sub_ps(mxv, now)));
      mxv = now;
      __m512 tot0 = _mm512_setzero_ps(), tot1 = _mm512_setzero_ps();
      for (int t = 0; t < BT; t += 2) {
        __m512 w0 = _mm512_setzero_ps(), w1 = _mm512_setzero_ps();
        if (vis[t]) {
          w0 = _mm512_maskz_mov_ps(vis[t], exp_poly(_mm512_sub_ps(sc[t], now)));
          tot0 = _mm512_add_ps(tot0, w0);
          if (split) w0 = _mm512_mul_ps(w0, _mm512_set1_ps(tscale[t]));
        }
        if (vis[t + 1]) {
          w1 = _mm512_maskz_mov_ps(vis[t + 1], exp_poly(_mm512_sub_ps(sc[t + 1], now)));
          tot1 = _mm512_add_ps(tot1, w1);
          if (split) w1 = _mm512_mul_ps(w1, _mm512_set1_ps(tscale[t + 1]));
        }
        _mm512_storeu_si512(a.wt.data() + (t / 2) * 16, pair_words(w0, w1));  // lane g: (w_t[g], w_t+1[g])
      }
      sumv = _mm512_fmadd_ps(sumv, alpha, _mm512_add_ps(tot0, tot1));
      alignas(64) float al[16];
      _mm512_store_ps(al, alpha);
      transpose16(a.wt.data(), 16, a.w.data(), 16);
      amx_decode_values(a.w.data(), s.pairs, r, a.pv.data());
      for (int g = 0; g < G; ++g) {  // acc = acc * alpha + pv (one rounding)
        const __m512 ag = _mm512_set1_ps(al[g]);
        float* o = am[g];
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
