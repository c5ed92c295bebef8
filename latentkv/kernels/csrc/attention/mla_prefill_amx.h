// The bf16 prefill span (mla_prefill_bf16.h's contract: the job, its key blocks of KB at absolute
// positions, the online softmax) on AMX tiles, transposed so that query rows are vector lanes:
//   scores  S^T [keys][rows] = K . Q^T: A tiles the keys as they lie (16 keys x 16 pairs), B tiles
//           the pass's queries packed as [16 pairs][32 rows] (two 16-row groups).
//   softmax per 16-row group over the C tiles' key rows: one vector per key, so the running max and
//           sum need no horizontal reductions, e^x as 2^(x log2 e) by vscalefps.
//   values  O^T [dims][rows] = V^T . P^T: A tiles the values packed as [dims][pairs of keys] once per
//           block and head, B tiles the probabilities as [pairs of keys][rows]; the running outputs
//           are kept as [dims][rows] for the item, so the rescale by alpha is one vector per dim.
// Included by attention_amx_bf16.cpp inside `namespace isa_amx_bf16` (target includes amx-tile and
// amx-bf16; these functions run only on the amx_bf16 path) after mla_prefill_bf16.h.
//
// The job's P (query / key pairs) is padded to a multiple of 16 with zero pairs (a tile's depth).
// The running max m is kept in raw (unscaled) scores here: m, l, acc stay this kernel's between the
// spans of one prefill (attention/prefill.py calls one kernel for all of them).
// A row's bits: its scores are one tile lane's products in the instruction's order over the pairs,
// its softmax lane-wise in key order, its output fma(acc, alpha, one lane's products over the
// block's keys): nothing depends on the other rows in its tile, the item, the thread or the span's
// position in the prompt (batch-invariant as the vdpbf16ps kernel, in another order).

constexpr int AMX_ROWS = 32;  // query rows per pass: two 16-row groups

#include "amx_tiles.h"

static_assert(KB == 64, "two halves of 32 keys per block, two steps of 16 key pairs");

// Keys as A tiles, in the job's kp buffer [H, nkb, KB keys, P pairs] (the vdpbf16ps kernel's size):
// only where they cannot be read in place (amx_layout).
static void prefill_pack_keys_amx(const PrefillJob& j, int h, int kb) {
  uint32_t* ka = reinterpret_cast<uint32_t*>(j.kp + ((int64_t)h * j.nkb + kb) * j.P * KB * 2);
  for (int k = 0; k < KB; ++k) {
    const int64_t t = (int64_t)kb * KB + k;
    uint32_t* row = ka + (int64_t)k * j.P;
    if (j.dn % 2 == 0) {  // the key's words as they lie: the nope part, then the rope key
      std::memcpy(row, kv_row(j, t, h), (size_t)j.dn * 2);
      std::memcpy(row + j.dn / 2, rope_key(j, t, h), (size_t)j.dr * 2);
      std::fill(row + (j.dn + j.dr) / 2, row + j.P, 0u);
    } else {
      for (int p = 0; p < j.P; ++p) row[p] = (uint32_t)key_elem(j, t, h, 2 * p) | (uint32_t)key_elem(j, t, h, 2 * p + 1) << 16;
    }
  }
}

// Head h's key block kb of V^T tiles in the job's vp buffer [Hk, nkb, dvp, KB/2 pairs of keys]
// (one per kv head: heads that share kv rows share their tiles).
static inline uint32_t* values_tiles(const PrefillJob& j, int h, int kb) {
  return reinterpret_cast<uint32_t*>(j.vp + ((int64_t)(h / j.hpk) * j.nkb + kb) * (KB / 2) * j.dvp * 2);
}

// A block's values as V^T A tiles, vt [dvp][KB/2 pairs of keys] (zero dims past dv).
static void prefill_pack_values_amx(const PrefillJob& j, int h, int kb, uint32_t* vt) {
  alignas(64) uint32_t pairs[16 * 16];
  for (int p0 = 0; p0 < KB / 2; p0 += 16)
    for (int d0 = 0; d0 < j.dvp; d0 += 16) {
      const __mmask16 live = (__mmask16)((1u << std::min(16, j.dv - d0)) - 1);
      for (int p = 0; p < 16; ++p) {
        const int64_t t = (int64_t)kb * KB + 2 * (p0 + p);
        const uint16_t* v0 = kv_row(j, t, h) + j.dn + d0;
        const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, v0));
        const __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, v0 + kv_stride(j)));
        _mm512_store_si512(pairs + p * 16, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
      }
      transpose16(pairs, 16, vt + (int64_t)d0 * (KB / 2) + p0, KB / 2);
    }
}

// The keys' A tiles read where they lie, without a packing pass: the nope part in steps of 32
// elements of the kv rows (H * (dn + dv) apart; a step past dn reads the row's first values,
// against query pairs that are zero there: products of 0), then the rope key in steps of 32 (dr
// apart, or G * dr for grouped rope keys). Needs dr a multiple of 32 and the nope steps within the row (DeepSeek's 128 + 64, the
// conversions' 50 + 96). Sets the job's pairs for it: pn = the nope steps' pairs, P whole tiles.
static inline void amx_layout(PrefillJob& j) {
  const int nope = (j.dn + 31) / 32 * 32;
  j.keys_in_place = j.dr % 32 == 0 && nope <= j.dn + j.dv && (nope + j.dr) / 32 <= 32;
  if (j.keys_in_place) j.pn = nope / 2, j.P = j.pn + j.dr / 2;
  else j.P = (j.P + 15) / 16 * 16;  // zero pairs past dn + dr
}

// Where step s of a key block's A tiles starts (its row 0: the block's key 0) and its row stride.
struct KeyTiles {
  const uint32_t* at[32];
  int stride[32];  // bytes
};

static inline void key_tiles(const PrefillJob& j, int h, int kb, KeyTiles& kt) {
  if (!j.keys_in_place) {
    const uint32_t* ka = reinterpret_cast<const uint32_t*>(j.kp + ((int64_t)h * j.nkb + kb) * j.P * KB * 2);
    for (int s = 0; s < j.P / 16; ++s) kt.at[s] = ka + 16 * s, kt.stride[s] = j.P * 4;
    return;
  }
  const int64_t t = (int64_t)kb * KB;
  const int nope_steps = j.pn / 16;
  for (int s = 0; s < nope_steps; ++s)
    kt.at[s] = reinterpret_cast<const uint32_t*>(kv_row(j, t, h) + 32 * s), kt.stride[s] = (int)kv_stride(j) * 2;
  for (int s = nope_steps; s < j.P / 16; ++s)
    kt.at[s] = reinterpret_cast<const uint32_t*>(rope_key(j, t, h) + 32 * (s - nope_steps)), kt.stride[s] = j.krs * 2;
}

// st [KB keys][32 rows] = the block's keys kt . the pass's queries qt [P/16][16 pairs][32 rows],
// unscaled: per half of 32 keys C tiles 0-3 (keys 0-15 / 16-31 x rows 0-15 / 16-31), A tiles 4-5,
// B tiles 6-7.
static inline void amx_prefill_scores(const KeyTiles& kt, int P, const uint32_t* qt, float* st) {
  for (int half = 0; half < 2; ++half) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int s = 0; s < P / 16; ++s) {
      const char* k = reinterpret_cast<const char*>(kt.at[s]) + (int64_t)32 * half * kt.stride[s];
      _tile_loadd(4, k, kt.stride[s]);
      _tile_loadd(6, qt + s * 512, 128);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, qt + s * 512 + 16, 128);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, k + (int64_t)16 * kt.stride[s], kt.stride[s]);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* o = st + 32 * half * 32;
    _tile_stored(0, o, 128);
    _tile_stored(1, o + 16, 128);
    _tile_stored(2, o + 16 * 32, 128);
    _tile_stored(3, o + 16 * 32 + 16, 128);
  }
}

// pvt [dvp][32 rows] (the 16 rows of group g at lanes 16 g) = vt ([dvp][KB/2]) . pt ([KB/2][32 rows]):
// C tiles 0-3 (16 dims each), A tiles 4 / 5 / 7 / 4, B tile 6.
static inline void amx_prefill_values(const uint32_t* vt, int dvp, const uint32_t* pt, int g, float* pvt) {
  for (int d0 = 0; d0 < dvp; d0 += 64) {
    const int nd = std::min(4, (dvp - d0) / 16);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int s = 0; s < 2; ++s) {  // 16 pairs of keys a step
      const uint32_t* a = vt + (int64_t)d0 * (KB / 2) + 16 * s;
      _tile_loadd(6, pt + s * 16 * 32 + 16 * g, 128);
      _tile_loadd(4, a, KB * 2);
      _tile_dpbf16ps(0, 4, 6);
      if (nd > 1) {
        _tile_loadd(5, a + 16 * (KB / 2), KB * 2);
        _tile_dpbf16ps(1, 5, 6);
      }
      if (nd > 2) {
        _tile_loadd(7, a + 32 * (KB / 2), KB * 2);
        _tile_dpbf16ps(2, 7, 6);
      }
      if (nd > 3) {
        _tile_loadd(4, a + 48 * (KB / 2), KB * 2);
        _tile_dpbf16ps(3, 4, 6);
      }
    }
    float* o = pvt + (int64_t)d0 * 32 + 16 * g;
    _tile_stored(0, o, 128);
    if (nd > 1) _tile_stored(1, o + 16 * 32, 128);
    if (nd > 2) _tile_stored(2, o + 32 * 32, 128);
    if (nd > 3) _tile_stored(3, o + 48 * 32, 128);
  }
}

// 2^x: x = n + f, f in [-1/2, 1/2], 2^f by Cephes' exp2f polynomial (~2 ulp), 2^n by vscalefps
// (which also takes n past the exponent range to 0 or inf). Only finite x reach the lanes used.
static inline __m512 exp2_poly(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// One 16-row group's online-softmax step over a block (scores st [KB][32], lanes 16 g .. 16 g + 15):
// updates m / l (raw-score max, sum), writes the probabilities as bf16 pairs of keys pt [KB/2][32]
// and returns alpha. pos: the lanes' positions; k0: the block's first key position.
static inline __m512 amx_prefill_softmax(const float* st, int g, __m512i pos, int64_t k0, float c, __m512* m,
                                         __m512* l, uint32_t* pt) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  // lane i sees keys k with k0 + k <= pos_i: the first (pos_i - k0 + 1) of the block
  const __m512i seen = _mm512_sub_epi32(pos, _mm512_set1_epi32((int)k0));  // key index of the lane's last visible key
  __mmask16 vis[KB];
  __m512 tmax = ninf;
  const bool whole = _mm512_cmp_epi32_mask(seen, _mm512_set1_epi32(KB - 1), _MM_CMPINT_NLT) == 0xFFFF;  // no causal cut
  for (int k = 0; k < KB; ++k) {
    vis[k] = whole ? (__mmask16)0xFFFF : _mm512_cmp_epi32_mask(seen, _mm512_set1_epi32(k), _MM_CMPINT_NLT);
    tmax = _mm512_mask_max_ps(tmax, vis[k], tmax, _mm512_loadu_ps(st + k * 32 + 16 * g));
  }
  const __mmask16 any = vis[0];
  const __m512 old = *m, now = _mm512_mask_max_ps(old, any, old, tmax);
  const __m512 cv = _mm512_set1_ps(c), mc = _mm512_mul_ps(now, cv);
  // alpha: 1 where no key of the block is seen (the state stays as it was), 0 from an empty state
  const __mmask16 had = _mm512_cmp_ps_mask(old, ninf, _CMP_NEQ_OQ);
  __m512 alpha = _mm512_maskz_mov_ps(had, exp2_poly(_mm512_sub_ps(_mm512_mul_ps(old, cv), mc)));
  alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), any, alpha);
  *m = now;
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  for (int k = 0; k < KB; k += 2) {
    const __m512 p0 = _mm512_maskz_mov_ps(vis[k], exp2_poly(_mm512_fmsub_ps(_mm512_loadu_ps(st + k * 32 + 16 * g), cv, mc)));
    const __m512 p1 =
        _mm512_maskz_mov_ps(vis[k + 1], exp2_poly(_mm512_fmsub_ps(_mm512_loadu_ps(st + (k + 1) * 32 + 16 * g), cv, mc)));
    s0 = _mm512_add_ps(s0, p0);
    s1 = _mm512_add_ps(s1, p1);
    _mm512_storeu_si512(pt + (k / 2) * 32 + 16 * g, pair_words(p0, p1));
  }
  *l = _mm512_fmadd_ps(*l, alpha, _mm512_add_ps(s0, s1));
  return alpha;
}

// Per-thread scratch: an item's queries as B tiles, its running outputs as [dvp][RB rows].
struct AmxScratch {
  std::vector<uint32_t> qt, rows, pt, vt;  // qt [RB/32][P/16][16][32], rows [16][P], pt [RB/32][KB/2][32], vt [dvp][KB/2]
  std::vector<float> st, pvt, ot;          // st [KB][32], pvt [dvp][32], ot [dvp][RB]
  AmxScratch(const PrefillJob& j)
      : qt((size_t)RB * j.P), rows((size_t)16 * j.P), pt(RB * (KB / 2)), vt((size_t)j.dvp * (KB / 2)), st(KB * 32),
        pvt((size_t)j.dvp * 32), ot((size_t)j.dvp * RB) {}
};

// Rows [i0, i1) (<= RB) of head h against every key block of the span they see. values_packed:
// the job's vp holds every block's V^T tiles; else each block's are packed here, into s.vt.
static void prefill_item_amx(const PrefillJob& j, int h, int i0, int i1, bool values_packed, AmxScratch& s) {
  const int rows = i1 - i0, passes = (rows + AMX_ROWS - 1) / AMX_ROWS, P = j.P, dvp = j.dvp;
  const int64_t last = j.first + i1 - 1;
  if (last < j.key_start) return;
  const float c = j.scale * 1.4426950408889634f;  // e^(scale x) = 2^(c x)
  __m512 m[RB / 16], l[RB / 16];
  alignas(64) float mr[16], lr[16];
  for (int g = 0; g < passes * 2; ++g) {  // 16 rows: queries as B tiles, state into lanes, outputs into ot
    for (int i = 0; i < 16; ++i) {
      const int r = 16 * g + i;
      const int64_t st = (int64_t)(i0 + r) * j.H + h;
      query_pairs(j, r < rows ? j.q + st * (j.dn + j.dr) : nullptr, s.rows.data() + (int64_t)i * P);
      const bool held = r < rows && j.key_start > 0;  // the first span (keys from 0) starts each row afresh
      mr[i] = held ? j.m[st] : -__builtin_inff();
      lr[i] = held ? j.l[st] : 0.0f;
      uint32_t* o = reinterpret_cast<uint32_t*>(s.pvt.data()) + (int64_t)i * dvp;  // rows x dims, transposed below
      if (held) std::memcpy(o, j.acc + st * dvp, (size_t)dvp * 4);
      else std::fill(o, o + dvp, 0u);
    }
    m[g] = _mm512_load_ps(mr), l[g] = _mm512_load_ps(lr);
    uint32_t* qt = s.qt.data() + (int64_t)(g / 2) * P * 32 + 16 * (g % 2);
    for (int p = 0; p < P; p += 16) transpose16(s.rows.data() + p, P, qt + (int64_t)p * 32, 32);
    for (int d = 0; d < dvp; d += 16)
      transpose16(reinterpret_cast<const uint32_t*>(s.pvt.data()) + d, dvp,
                  reinterpret_cast<uint32_t*>(s.ot.data()) + (int64_t)d * RB + 16 * g, RB);
  }
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const int kb_end = (int)std::min<int64_t>(j.nkb, (last - j.key_start) / KB + 1);
  for (int kb = 0; kb < kb_end; ++kb) {
    const int64_t k0 = j.key_start + (int64_t)kb * KB;
    KeyTiles kt;
    key_tiles(j, h, kb, kt);
    if (!values_packed) prefill_pack_values_amx(j, h, kb, s.vt.data());
    const uint32_t* vt = values_packed ? values_tiles(j, h, kb) : s.vt.data();
    // every pass's scores and softmax first, then the value sums: the probabilities' vector stores
    // then retire before the value tiles load them (a tile load right after stalls)
    __m512 alpha[RB / 16];
    bool active[RB / AMX_ROWS];
    for (int pass = 0; pass < passes; ++pass) {
      active[pass] = j.first + i0 + std::min(AMX_ROWS * (pass + 1), rows) - 1 >= k0;
      if (!active[pass]) continue;  // the whole pass sits before the block
      amx_prefill_scores(kt, P, s.qt.data() + (int64_t)pass * P * 32, s.st.data());
      for (int g = 0; g < 2; ++g) {
        const int gi = 2 * pass + g;
        const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32((int)(j.first + i0 + 16 * gi)), lane);
        alpha[gi] = amx_prefill_softmax(s.st.data(), g, pos, k0, c, &m[gi], &l[gi], s.pt.data() + pass * (KB / 2) * 32);
      }
    }
    for (int pass = 0; pass < passes; ++pass) {
      if (!active[pass]) continue;
      for (int g = 0; g < 2; ++g) amx_prefill_values(vt, dvp, s.pt.data() + pass * (KB / 2) * 32, g, s.pvt.data());
      for (int g = 0; g < 2; ++g) {  // o = o * alpha + pv (one rounding)
        const int gi = 2 * pass + g;
        for (int d = 0; d < dvp; ++d) {
          float* o = s.ot.data() + (int64_t)d * RB + 16 * gi;
          _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(o), alpha[gi], _mm512_loadu_ps(s.pvt.data() + d * 32 + 16 * g)));
        }
      }
    }
  }
  for (int g = 0; g < passes * 2; ++g) {
    _mm512_store_ps(mr, m[g]), _mm512_store_ps(lr, l[g]);
    uint32_t* o = reinterpret_cast<uint32_t*>(s.pvt.data());  // [16 rows][dvp]
    for (int d = 0; d < dvp; d += 16)
      transpose16(reinterpret_cast<const uint32_t*>(s.ot.data()) + (int64_t)d * RB + 16 * g, RB, o + d, dvp);
    for (int i = 0; i < 16 && 16 * g + i < rows; ++i) {
      const int64_t st = (int64_t)(i0 + 16 * g + i) * j.H + h;
      std::memcpy(j.acc + st * dvp, o + (int64_t)i * dvp, (size_t)dvp * 4);
      j.m[st] = mr[i], j.l[st] = lr[i];
    }
  }
}

// Packing passes first where they pay: the keys only where they cannot be read in place; the
// values once per block where a head's rows span several items (long prompts), else inside the
// item (a short chunk after a long context reads each block once: packing it all first would write
// and reread the span's values through memory).
static void prefill_run_amx(PrefillJob& j, int nthreads) {
  const int items_per_head = (j.n + RB - 1) / RB;
  const bool pack_keys = !j.keys_in_place, pack_values = items_per_head > 1;
#pragma omp parallel num_threads(nthreads)
  {
    if (pack_keys || pack_values) {
#pragma omp for schedule(static)
      for (int64_t it = 0; it < (int64_t)j.H * j.nkb; ++it) {
        const int h = (int)(it / j.nkb), kb = (int)(it % j.nkb);
        if (pack_keys) prefill_pack_keys_amx(j, h, kb);
        if (pack_values && h % j.hpk == 0) prefill_pack_values_amx(j, h, kb, values_tiles(j, h, kb));
      }
    }
    AmxScratch scratch(j);
    amx_configure();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < (int64_t)j.H * items_per_head; ++it) {
      int h, b;
      prefill_item_of(it, items_per_head, &h, &b);
      prefill_item_amx(j, h, b * RB, std::min(j.n, (b + 1) * RB), pack_values, scratch);
    }
    _tile_release();
  }
}
