// Paged MLA decode over an int8 latent and an int8 rope key (cache int8_rope8) on AMX, for bf16
// queries on CPUs with amx_int8 too. Included by attention_amx_int8.cpp inside `namespace isa_amx_int8`
// after mla_decode_amx.h (amx_item: the chunk loop, softmax and value sums it shares).
//
// The codes are never widened for the scores: per half-tile of 16 tokens, S^T = K . Q^T as int8
// tile products (TDPBSSD) with the cache rows as the A tiles where they lie (16 tokens x 64 codes:
// a block holds whole half-tiles when block_size % 16 == 0; else the rows are copied) and each
// query row in int8 twice, q / qs ~ hi + lo / 256 per part (latent, rope) with its own scale qs
// (mla_decode_vnni.h quantize_two_part: one int8 part alone costs ~10x the bf16 path's error). hi and lo sum in separate C tiles
// (their 2 x 9 columns do not fit one tile's 16), exactly in int32 (two halves by hi / lo per step:
// four independent products, each B tile loaded once for 32 tokens), so
//   s = scale_t * qs_lat * (hi + lo / 256)_lat + rope_scale_t * qs_rope * (hi + lo / 256)_rope.
// The values stay bf16 products (amx_item's pass 2): only the latent is widened, straight into
// token pairs (pair_rows' layout), half the widening of the bf16 path and no second pass.
// Requires kv_rank % 64 == 0 and a rope width % 64 == 0 (mla_attention.cpp decode_loops picks the bf16 AMX
// path otherwise). Batch-invariant as mla_decode_amx.h: a row's bits depend on its query, its
// position and the keys alone.
#include "mla_job.h"

constexpr int I8_STEP = 64;  // int8 values per tile step (a row of 64 bytes)

// The B tiles of every sequence's query rows q [B, M, D], in int8 twice (hi, lo) per part, packed
// once per call: for sequence b and group m0 / 16, blocks [lat hi, lat lo, rope hi, rope lo] of
// steps x [16 quads][16 rows] words (step c's quad p of row g: the part's values 64c + 4p .. + 3);
// qs [B, M, 2]: the latent's and the rope's scale per row (rows past M: zero words).
static inline int64_t amx_i8_query_block(int D) { return (int64_t)(D / I8_STEP) * 256 * 2; }

static void pack_queries_i8(const uint16_t* q, int64_t B, int M, int D, int r, uint32_t* out, float* qs, int threads) {
  const int groups = (M + AMX_DECODE_ROWS - 1) / AMX_DECODE_ROWS;
#pragma omp parallel num_threads(threads)
  {
    std::vector<int8_t> codes((size_t)2 * 16 * D);  // [hi, lo][16 rows][D]
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < B * groups; ++bg) {
      const int64_t b = bg / groups;
      const int m0 = (int)(bg % groups) * AMX_DECODE_ROWS, G = M - m0 < AMX_DECODE_ROWS ? M - m0 : AMX_DECODE_ROWS;
      for (int g = G; g < 16; ++g)  // rows past M: zero words
        for (int hl = 0; hl < 2; ++hl) std::memset(codes.data() + (int64_t)(16 * hl + g) * D, 0, (size_t)D);
      for (int g = 0; g < G; ++g) {
        const uint16_t* row = q + (b * M + m0 + g) * D;
        for (int part = 0; part < 2; ++part) {
          const int lo = part ? r : 0, hi = part ? D : r;
          qs[(b * M + m0 + g) * 2 + part] = quantize_two_part(row + lo, hi - lo, codes.data() + (int64_t)g * D + lo,
                                                              codes.data() + (int64_t)(16 + g) * D + lo);
        }
      }
      uint32_t* dst = out + bg * amx_i8_query_block(D);
      for (int part = 0; part < 2; ++part)
        for (int hl = 0; hl < 2; ++hl) {  // 0: hi, 1: lo; blocks in the order lat hi, lat lo, rope hi, rope lo
          const int lo = part ? r : 0, steps = ((part ? D : r) - lo) / I8_STEP;
          const uint32_t* src = (const uint32_t*)(codes.data() + (int64_t)hl * 16 * D + lo);
          for (int c = 0; c < steps; ++c, dst += 256) transpose16(src + 16 * c, D / 4, dst, 16);
        }
    }
  }
}

// The codes of a half-tile's 16 tokens from j (j % 16 == 0; n of them in the span) as A-tile
// operands: the latent's base and stride in bytes, and the rope's. In place where the 16 rows
// are one block's consecutive slots, else copied into `copy` [16][r + dr] (rows past n zero).
static inline void half_codes(const Job& job, const int64_t* table, int64_t j, int n, int8_t* copy,
                              const int8_t** lat, int* lat_ld, const int8_t** rope, int* rope_ld) {
  const int r = job.r, dr = job.D - job.r, bs = job.bs;
  if (bs % 16 == 0) {
    const int64_t slot = table[j / bs] * bs + j % bs;
    *lat = (const int8_t*)job.latent + slot * r, *lat_ld = r;
    *rope = (const int8_t*)job.rope + slot * dr, *rope_ld = dr;
    return;
  }
  for (int t = 0; t < 16; ++t) {
    int8_t* dst = copy + (int64_t)t * (r + dr);
    if (t >= n) {
      std::memset(dst, 0, (size_t)(r + dr));
      continue;
    }
    const int64_t slot = table[(j + t) / bs] * bs + (j + t) % bs;
    std::memcpy(dst, (const int8_t*)job.latent + slot * r, (size_t)r);
    std::memcpy(dst + r, (const int8_t*)job.rope + slot * dr, (size_t)dr);
  }
  *lat = copy, *rope = copy + r, *lat_ld = *rope_ld = r + dr;
}

// One tile's int32 sums ci [part: latent, rope][half][hi, lo][16 tokens][16 rows] from its halves'
// codes (A: lat / rope of half h with their row strides; half 1 null: 16 tokens or fewer): per part,
// two A tiles (4, 5: the halves) by two B tiles (6, 7: hi, lo) into four C tiles (0-3), every
// step's four products independent (each B load serves both halves).
static inline void amx_i8_tile_scores(const int8_t* const* lat, const int* lat_ld, const int8_t* const* rope,
                                      const int* rope_ld, int nl, int nr, const uint32_t* qb, int32_t* ci) {
  for (int part = 0; part < 2; ++part) {
    const int8_t* const* a = part ? rope : lat;
    const int* ld = part ? rope_ld : lat_ld;
    const int steps = part ? nr : nl;
    const uint32_t* q_hi = qb + (part ? 2 * nl * 256 : 0);
    const uint32_t* q_lo = q_hi + steps * 256;
    _tile_zero(0);
    _tile_zero(1);
    if (a[1]) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int i = 0; i < steps; ++i) {
      _tile_loadd(4, a[0] + i * I8_STEP, ld[0]);
      _tile_loadd(6, q_hi + i * 256, 64);
      _tile_loadd(7, q_lo + i * 256, 64);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      if (a[1]) {
        _tile_loadd(5, a[1] + i * I8_STEP, ld[1]);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
    }
    int32_t* c = ci + part * 1024;
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    if (a[1]) {
      _tile_stored(2, c + 512, 64);
      _tile_stored(3, c + 768, 64);
    }
  }
}

// One item as attend_span_amx over an int8 latent and rope; qpack: the sequence's blocks from
// pack_queries_i8, qs its rows' scales [M, 2].
static void attend_span_amx_i8(const Job& job, int64_t b, int64_t t0, int64_t t1, const uint32_t* qpack,
                               const float* qs, const int64_t* lim, float* acc, float* mx, float* sum,
                               const Bf16Scratch& s, AmxDecodeScratch& a) {
  const int D = job.D, r = job.r, dr = D - r, nl = r / I8_STEP, nr = dr / I8_STEP;
  const int64_t* table = job.block_tables + b * job.nb;
  int8_t* copy = (int8_t*)s.tile;  // [2][16][r + dr] codes where a half-tile is not in place
  const int8_t* zero = (const int8_t*)s.zero;
  alignas(64) int32_t ci[8 * 256];
  amx_item(job, t0, t1, lim, true, acc, mx, sum, a, [&](int m0, int64_t c0, int nt, int tiles) {
    const int G = job.M - m0 < AMX_DECODE_ROWS ? job.M - m0 : AMX_DECODE_ROWS;
    const uint32_t* qb = qpack + (int64_t)(m0 / AMX_DECODE_ROWS) * amx_i8_query_block(D);
    alignas(64) float sl[16] = {}, sr[16] = {};
    for (int g = 0; g < G; ++g) sl[g] = qs[(m0 + g) * 2], sr[g] = qs[(m0 + g) * 2 + 1];
    const __m512 qsl = _mm512_load_ps(sl), qsr = _mm512_load_ps(sr), inv256 = _mm512_set1_ps(1.0f / 256.0f);
    for (int k = 0; k < tiles; ++k) {
      const int64_t j0 = c0 + (int64_t)k * BT;
      const int n = (int)(c0 + nt - j0 < BT ? c0 + nt - j0 : BT);
      const int64_t p0 = j0 + BT, p1 = p0 + BT < t1 ? p0 + BT : t1;
      prefetch_rows(job, table, p0, p1, 0, 2);
      const int8_t* lat_rows[BT];
      for (int t = 0; t < BT; ++t) lat_rows[t] = zero;
      const int8_t *lat[2] = {nullptr, nullptr}, *rope[2] = {nullptr, nullptr};
      int lat_ld[2], rope_ld[2];
      for (int h = 0; h * 16 < n; ++h)
        half_codes(job, table, j0 + 16 * h, n - 16 * h < 16 ? n - 16 * h : 16, copy + (int64_t)h * 16 * D, &lat[h],
                   &lat_ld[h], &rope[h], &rope_ld[h]);
      amx_i8_tile_scores(lat, lat_ld, rope, rope_ld, nl, nr, qb, ci);
      int64_t blk = j0 / job.bs, off = j0 % job.bs;  // walked, not divided per token
      for (int t = 0; t < n; ++t) {
        const int h = t / 16, tt = k * BT + t;
        const int64_t slot = table[blk] * job.bs + off;
        if (++off == job.bs) off = 0, ++blk;
        const float ts = job.scale[slot * 2], rs = job.scale[slot * 2 + 1];
        const int32_t* cl = ci + h * 512 + (t % 16) * 16;  // the latent's hi; lo 256 on, the rope's 1024 on
        a.tscale[tt] = ts;
        lat_rows[t] = lat[h] + (int64_t)(t % 16) * lat_ld[h];
        const __m512 x = _mm512_mul_ps(qsl, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cl + 256)), inv256,
                                                            _mm512_cvtepi32_ps(_mm512_load_si512(cl))));
        const __m512 y = _mm512_mul_ps(qsr, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cl + 1280)), inv256,
                                                            _mm512_cvtepi32_ps(_mm512_load_si512(cl + 1024))));
        _mm512_storeu_ps(a.st_lat.data() + tt * 16, _mm512_fmadd_ps(x, _mm512_set1_ps(ts), _mm512_mul_ps(y, _mm512_set1_ps(rs))));
      }
      prefetch_rows(job, table, p0, p1, 1, 2);
      // the latent widened straight into token pairs (pair_rows' layout)
      uint16_t* pairs = a.pairs.data() + (int64_t)k * BT * r;
      for (int p = 0; p < BT / 2; ++p) {
        const int8_t *x = lat_rows[2 * p], *y = lat_rows[2 * p + 1];
        uint16_t* dst = pairs + (int64_t)p * 2 * r;
        for (int i = 0; i < r; i += 32) {
          const __m512i u = widen_i8x32(x + i), v = widen_i8x32(y + i);
          _mm512_storeu_si512((void*)(dst + 2 * i), _mm512_unpacklo_epi16(u, v));
          _mm512_storeu_si512((void*)(dst + 2 * i + 32), _mm512_unpackhi_epi16(u, v));
        }
      }
    }
  });
}
