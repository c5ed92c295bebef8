// The bf16 prefill span (mla_prefill_bf16.h's contract, packing and online softmax) with its two
// products on AMX tiles: scores of 16 query rows x 16 keys per C tile (A: the rows' query pairs,
// B: the packed key pairs as they lie: [16 pairs][16 keys] at a stride of KB keys), then the
// values (A: the rows' probability pairs, B: the packed value pairs: [16 key pairs][16 dims]).
// Included by mla_attention.cpp inside `namespace isa_avx512bf16` (its target includes amx-tile
// and amx-bf16; these functions run only where cpu_isa.h's code 4 holds) after mla_prefill_bf16.h.
//
// The job's P (query / key pairs) is padded to a multiple of 16 with zero pairs (a tile's depth).
// A row's bits: its scores are one tile lane's products in the unit's order over the pairs, its
// softmax the bf16 kernel's, its output fma(acc, alpha, one tile lane's products over the block's
// keys): nothing depends on the other rows in its tile, the item, the thread or the
// span's position in the prompt (batch-invariant as the vdpbf16ps kernel, in another order).

constexpr int AMX_ROWS = 32;  // query rows per pass: two 16-row tiles

#include "amx_tiles.h"

// sc [32 rows][KB] = q pairs qp [32 rows][P] . key block kp ([P][KB][2] bf16), unscaled, in two
// halves of 32 keys: C tiles 0-3 (rows 0-15 / 16-31 x keys 0-15 / 16-31 of the half), A tiles 4-5,
// B tiles 6-7, each loaded once per 16 pairs (no tile waits for a product still reading it).
static inline void amx_scores(const uint32_t* qp, int P, const uint16_t* kp, float* sc) {
  static_assert(KB == 64, "two halves of 32 keys per block");
  for (int half = 0; half < 2; ++half) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int p = 0; p < P; p += 16) {
      const uint16_t* k = kp + ((int64_t)p * KB + 32 * half) * 2;
      _tile_loadd(4, qp + p, P * 4);
      _tile_loadd(6, k, KB * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, k + 32, KB * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, qp + 16 * P + p, P * 4);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* out = sc + 32 * half;
    _tile_stored(0, out, KB * 4);
    _tile_stored(1, out + 16, KB * 4);
    _tile_stored(2, out + 16 * KB, KB * 4);
    _tile_stored(3, out + 16 * KB + 16, KB * 4);
  }
}

// pv [16 rows][dvp] = pp [16 rows][KB/2 pairs] . vp ([KB/2][dvp][2] bf16), for value dims
// [d0, d0 + 16 nd), nd <= 4: C tiles 0..nd-1 from zero, A tile 4, B tiles 5-7. (The running
// outputs are not loaded into the tiles: vector stores just before would stall the tile loads.)
static inline void amx_values(float* pv, int dvp, const uint32_t* pp, const uint16_t* vp, int d0, int nd) {
  const int so = dvp * 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int half = 0; half < KB / 32; ++half) {  // 16 key pairs per A tile
    const uint16_t* v = vp + ((int64_t)half * 16 * dvp + d0) * 2;
    _tile_loadd(4, pp + half * 16, (KB / 2) * 4);
    _tile_loadd(5, v, so);
    _tile_dpbf16ps(0, 4, 5);
    if (nd > 1) {
      _tile_loadd(6, v + 32, so);
      _tile_dpbf16ps(1, 4, 6);
    }
    if (nd > 2) {
      _tile_loadd(7, v + 64, so);
      _tile_dpbf16ps(2, 4, 7);
    }
    if (nd > 3) {
      _tile_loadd(5, v + 96, so);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, pv + d0, so);
  if (nd > 1) _tile_stored(1, pv + d0 + 16, so);
  if (nd > 2) _tile_stored(2, pv + d0 + 32, so);
  if (nd > 3) _tile_stored(3, pv + d0 + 48, so);
}

// Per-thread scratch: the item's rows padded to whole tiles (zero queries past the item).
struct AmxScratch {
  std::vector<uint32_t> qp;  // [RB][P]
  std::vector<float> o, m, l, sc, pv, alpha;  // o [RB][dvp], m / l [RB], sc [32][KB], pv [32][dvp], alpha [RB]
  std::vector<uint32_t> pp;  // [RB][KB/2]
  AmxScratch(const PrefillJob& j)
      : qp((size_t)RB * j.P), o((size_t)RB * j.dvp), m(RB), l(RB), sc(AMX_ROWS * KB), pv((size_t)AMX_ROWS * j.dvp),
        alpha(RB), pp(RB * (KB / 2)) {}
};

// Rows [i0, i1) (<= RB) of head h against every key block of the span they see.
static void prefill_item_amx(const PrefillJob& j, int h, int i0, int i1, AmxScratch& s) {
  const int rows = i1 - i0, padded = (rows + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS, P = j.P, dvp = j.dvp;
  const int64_t last = j.first + i1 - 1;
  if (last < j.key_start) return;
  for (int r = 0; r < padded; ++r) {
    const int64_t st = (int64_t)(i0 + r) * j.H + h;
    query_pairs(j, r < rows ? j.q + st * (j.dn + j.dr) : nullptr, s.qp.data() + (int64_t)r * P);
    if (r < rows) std::memcpy(s.o.data() + (int64_t)r * dvp, j.acc + st * dvp, (size_t)dvp * 4);
    else std::fill(s.o.data() + (int64_t)r * dvp, s.o.data() + (int64_t)(r + 1) * dvp, 0.0f);
    s.m[r] = r < rows ? j.m[st] : -__builtin_inff();
    s.l[r] = r < rows ? j.l[st] : 0.0f;
  }
  const int kb_end = (int)std::min<int64_t>(j.nkb, (last - j.key_start) / KB + 1);
  for (int kb = 0; kb < kb_end; ++kb) {
    const int64_t k0 = j.key_start + (int64_t)kb * KB;
    const uint16_t* kp = j.kp + ((int64_t)h * j.nkb + kb) * P * KB * 2;
    const uint16_t* vp = j.vp + ((int64_t)h * j.nkb + kb) * (KB / 2) * dvp * 2;
    // every pass's scores and softmax first, then the value sums: the probabilities' vector
    // stores then retire before the value tiles load them (a tile load right after stalls)
    int active[RB / AMX_ROWS], na = 0;
    for (int g = 0; g < padded; g += AMX_ROWS) {
      if (j.first + i0 + std::min(g + AMX_ROWS, rows) - 1 < k0) continue;  // the whole pass sits before the block
      active[na++] = g;
      amx_scores(s.qp.data() + g * P, P, kp, s.sc.data());
      for (int r = 0; r < AMX_ROWS; ++r) {
        const int row = g + r;
        const int64_t pos = j.first + i0 + row;
        uint32_t* pr = s.pp.data() + row * (KB / 2);
        if (row >= rows || pos < k0) {  // not a row, or no key of this block visible: unchanged
          for (int k = 0; k < KB / 2; ++k) pr[k] = 0;
          s.alpha[row] = 1.0f;
          continue;
        }
        const int nv = (int)std::min<int64_t>(KB, pos - k0 + 1);
        s.alpha[row] = prefill_softmax(s.sc.data() + r * KB, nv, j.scale, &s.m[row], &s.l[row], pr);
      }
    }
    for (int a = 0; a < na; ++a) {
      const int g = active[a];
      for (int t = 0; t < AMX_ROWS; t += 16)
        for (int d0 = 0; d0 < dvp; d0 += 64)
          amx_values(s.pv.data() + t * dvp, dvp, s.pp.data() + (g + t) * (KB / 2), vp, d0, std::min(4, (dvp - d0) / 16));
      for (int r = 0; r < AMX_ROWS; ++r) {  // o = o * alpha + pv (one rounding)
        const __m512 al = _mm512_set1_ps(s.alpha[g + r]);
        float* o = s.o.data() + (g + r) * dvp;
        const float* pv = s.pv.data() + r * dvp;
        for (int d = 0; d < dvp; d += 16)
          _mm512_storeu_ps(o + d, _mm512_fmadd_ps(_mm512_loadu_ps(o + d), al, _mm512_loadu_ps(pv + d)));
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t st = (int64_t)(i0 + r) * j.H + h;
    std::memcpy(j.acc + st * dvp, s.o.data() + (int64_t)r * dvp, (size_t)dvp * 4);
    j.m[st] = s.m[r], j.l[st] = s.l[r];
  }
}

static void prefill_run_amx(PrefillJob& j, int nthreads) {
  const int items_per_head = (j.n + RB - 1) / RB;
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t it = 0; it < (int64_t)j.H * j.nkb; ++it) prefill_pack(j, (int)(it / j.nkb), (int)(it % j.nkb));
    AmxScratch scratch(j);
    amx_configure();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < (int64_t)j.H * items_per_head; ++it) {
      const int b = items_per_head - 1 - (int)(it / j.H), h = (int)(it % j.H);
      prefill_item_amx(j, h, b * RB, std::min(j.n, (b + 1) * RB), scratch);
    }
    _tile_release();
  }
}
