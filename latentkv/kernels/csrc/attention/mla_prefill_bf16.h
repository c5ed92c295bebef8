// Batch-invariant MLA prefill attention (the naive form: per-head keys expanded from the latent)
// with bf16 dot products (avx512_bf16: vdpbf16ps). Included by attention_avx512_bf16.cpp and
// attention_amx_bf16.cpp inside their namespaces after exp_poly.h (e^x) and mla_decode_bf16.h. No header includes here.
//
// One call attends rows of one sequence's prompt to one span of its keys and updates each row's
// online-softmax state (running max m, sum l, unnormalized output acc, all float32) in place;
// attention/prefill.py calls it span by span (memory bounded by the span, not the context) and
// divides acc by l at the end. A row visits its keys in blocks of KB at absolute positions, in
// order, each block with the same arithmetic whichever rows, thread or span share the call: a
// row's bits depend only on its query, its position and the keys (batch-invariant by design).
//   q   [n, H, dn + dr]  bf16, row i at position first + i
//   kv  [S, H, dn + dv]  bf16: kv_b_proj of the span's latents (k_nope, then v, per head)
//       or [S, Hk, dn + dv] one per group of hpk = H / Hk consecutive heads (heads whose kv_b_proj
//                        rows are equal: a converted GQA model's values, MLAttention.kv_groups)
//   k_r [S, dr]          bf16: the span's rotated rope keys, one for all heads; key t at key_start + t
//       or [S, G, dr]    one per group of hpg = H / G consecutive heads (grouped rope keys, model/rope_groups.py)
//   m, l [n, H], acc [n, H, dvp] float32 (dv padded to a multiple of 16; the pad stays 0)
// Scores: q . k with vdpbf16ps (bf16 x bf16 products exact in float32, summed in float32), times
// the softmax scale in float32. Values: the probabilities rounded to bf16 (2^-9 relative), two
// keys per vdpbf16ps, summed in float32.

constexpr int KB = PREFILL_KB;  // keys per block (mla_job.h): four 16-lane score vectors per query row (the softmax's
                        // reductions per block cost as much as 32 keys' dot products at KB = 16)
constexpr int RG = 4;   // query rows per score micro-kernel (16 accumulators)
constexpr int RB = 64;  // query rows per work item: their float32 state stays in L1

struct PrefillJob {
  int n, H, dn, dr, dv, dvp, P, pn, S, nkb;  // dvp: dv padded to a multiple of 16 (acc's width)
  int krs, hpg;                              // k_r's row stride (G * dr), heads per rope key (H / G)
  int kvh, hpk;                              // kv's heads (Hk) and heads per kv head (H / Hk)
  bool keys_in_place = false;                // AMX: key tiles read from kv / k_r (amx_layout)
  int64_t first, key_start;
  float scale;
  const uint16_t* q;
  const uint16_t* kv;
  const uint16_t* kr;
  uint16_t* kp;  // [H, nkb, P, KB, 2]: key pairs, lanes = keys
  uint16_t* vp;  // [H, nkb, KB/2, dvp, 2]: value pairs of two keys, lanes = value dims (0 past dv)
  float *m, *l, *acc;
};

// Head h's rope key [dr] at span row t.
static inline const uint16_t* rope_key(const PrefillJob& j, int64_t t, int h) {
  return j.kr + t * j.krs + (int64_t)(h / j.hpg) * j.dr;
}

// Head h's kv row [dn + dv] at span row t, and the distance between two span rows' kv.
static inline const uint16_t* kv_row(const PrefillJob& j, int64_t t, int h) {
  return j.kv + (t * j.kvh + h / j.hpk) * (j.dn + j.dv);
}
static inline int64_t kv_stride(const PrefillJob& j) { return (int64_t)j.kvh * (j.dn + j.dv); }

// Element e of head h's key at span row t (the nope part padded to an even width).
// Past the rope part (P padded to whole AMX tiles: mla_prefill_amx.h): zero pairs.
static inline uint16_t key_elem(const PrefillJob& j, int64_t t, int h, int e) {
  if (e < 2 * j.pn) return e < j.dn ? kv_row(j, t, h)[e] : 0;
  return e - 2 * j.pn < j.dr ? rope_key(j, t, h)[e - 2 * j.pn] : 0;
}

// As prefill_pack where dn is even: a key's pairs are its 32-bit words as they lie (the nope part,
// then the rope key), so the keys move word by word; values two keys at a time.
static void prefill_pack_words(const PrefillJob& j, int h, int kb) {
  uint32_t* kp = reinterpret_cast<uint32_t*>(j.kp + ((int64_t)h * j.nkb + kb) * j.P * KB * 2);
  uint32_t* vp = reinterpret_cast<uint32_t*>(j.vp + ((int64_t)h * j.nkb + kb) * (KB / 2) * j.dvp * 2);
  const int nope = j.dn / 2, rope = j.dr / 2;
  for (int k = 0; k < KB; ++k) {
    const int64_t t = (int64_t)kb * KB + k;
    const uint16_t* kv = kv_row(j, t, h);
    const uint16_t* kr = rope_key(j, t, h);
    for (int p = 0; p < nope; ++p) kp[p * KB + k] = (uint32_t)kv[2 * p] | (uint32_t)kv[2 * p + 1] << 16;
    for (int p = 0; p < rope; ++p) kp[(nope + p) * KB + k] = (uint32_t)kr[2 * p] | (uint32_t)kr[2 * p + 1] << 16;
    for (int p = nope + rope; p < j.P; ++p) kp[p * KB + k] = 0;
  }
  for (int k = 0; k < KB; k += 2) {
    const int64_t t = (int64_t)kb * KB + k;
    const uint16_t* v0 = kv_row(j, t, h) + j.dn;
    const uint16_t* v1 = v0 + kv_stride(j);
    uint32_t* dst = vp + (k / 2) * j.dvp;
    for (int d = 0; d < j.dv; ++d) dst[d] = (uint32_t)v0[d] | (uint32_t)v1[d] << 16;
    for (int d = j.dv; d < j.dvp; ++d) dst[d] = 0;
  }
}

// One query row q [dn + dr] (nullptr: a zero row) as the P pair words both prefill kernels read:
// the nope part as pn pairs (zero padded), then the rope part, zeros past it (P padded to AMX tiles).
static inline void query_pairs(const PrefillJob& j, const uint16_t* q, uint32_t* qr) {
  if (q && j.dn % 2 == 0) {  // the row's 32-bit words are its pairs as they lie
    std::memcpy(qr, q, (size_t)j.dn * 2);
    std::fill(qr + j.dn / 2, qr + j.pn, 0u);
    std::memcpy(qr + j.pn, q + j.dn, (size_t)j.dr * 2);
    std::fill(qr + j.pn + j.dr / 2, qr + j.P, 0u);
    return;
  }
  for (int p = 0; p < j.P; ++p) {
    uint32_t lo = 0, hi = 0;
    if (q) {
      const int e = 2 * p;
      if (e < 2 * j.pn) lo = e < j.dn ? q[e] : 0, hi = e + 1 < j.dn ? q[e + 1] : 0;
      else if (e - 2 * j.pn < j.dr) lo = q[j.dn + e - 2 * j.pn], hi = q[j.dn + e + 1 - 2 * j.pn];
    }
    qr[p] = lo | (hi << 16);
  }
}

static void prefill_pack(const PrefillJob& j, int h, int kb) {
  if (j.dn % 2 == 0) return prefill_pack_words(j, h, kb);
  uint16_t* kp = j.kp + ((int64_t)h * j.nkb + kb) * j.P * KB * 2;
  uint16_t* vp = j.vp + ((int64_t)h * j.nkb + kb) * (KB / 2) * j.dvp * 2;
  for (int k = 0; k < KB; ++k) {
    int64_t t = (int64_t)kb * KB + k;
    for (int p = 0; p < j.P; ++p) {
      kp[(p * KB + k) * 2] = key_elem(j, t, h, 2 * p);
      kp[(p * KB + k) * 2 + 1] = key_elem(j, t, h, 2 * p + 1);
    }
    const uint16_t* v = kv_row(j, t, h) + j.dn;
    uint16_t* dst = vp + (k / 2) * j.dvp * 2 + (k & 1);
    for (int d = 0; d < j.dvp; ++d) dst[2 * d] = d < j.dv ? v[d] : 0;
  }
}

// Scores of RG query rows (pairs qp [RG, P]) against one key block: sc [RG, KB] (unscaled).
// Per key pair: KB/16 loads, RG broadcasts, RG x KB/16 vdpbf16ps (runs near the CPU's peak).
static inline void prefill_scores(const uint32_t* qp, const uint16_t* kp, int P, float* sc) {
  __m512 a[RG][KB / 16];
  for (int r = 0; r < RG; ++r)
    for (int z = 0; z < KB / 16; ++z) a[r][z] = _mm512_setzero_ps();
  for (int p = 0; p < P; ++p) {
    __m512i k[KB / 16];
    for (int z = 0; z < KB / 16; ++z) k[z] = _mm512_loadu_si512(kp + p * KB * 2 + 32 * z);
#pragma GCC unroll 8
    for (int r = 0; r < RG; ++r) {
      __m512i qb = _mm512_set1_epi32((int)qp[r * P + p]);
      for (int z = 0; z < KB / 16; ++z) a[r][z] = _mm512_dpbf16_ps(a[r][z], as_bh(qb), as_bh(k[z]));
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int z = 0; z < KB / 16; ++z) _mm512_storeu_ps(sc + r * KB + 16 * z, a[r][z]);
}

// One row's online-softmax step over a block with nv visible keys: updates *mx, *sum; the
// probabilities as bf16 pairs pp [KB/2]; returns alpha, the rescale of the row's earlier acc.
static inline float prefill_softmax(const float* sc, int nv, float scale, float* mx, float* sum, uint32_t* pp) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff()), sv = _mm512_set1_ps(scale);
  __m512 s[KB / 16];
  __mmask16 mk[KB / 16];
  __m512 t = ninf;
  for (int z = 0; z < KB / 16; ++z) {
    int left = nv - 16 * z;
    mk[z] = (__mmask16)(left >= 16 ? 0xFFFF : left > 0 ? (1u << left) - 1 : 0);
    s[z] = _mm512_mask_mul_ps(ninf, mk[z], _mm512_loadu_ps(sc + 16 * z), sv);
    t = _mm512_max_ps(t, s[z]);
  }
  float tmax = _mm512_reduce_max_ps(t);
  float old = *mx, now = tmax > old ? tmax : old;
  float alpha = exp_poly(old - now);
  *mx = now;
  const __m512 nw = _mm512_set1_ps(now);
  __m512 total = _mm512_setzero_ps();
  for (int z = 0; z < KB / 16; z += 2) {
    __m512 p0 = _mm512_maskz_mov_ps(mk[z], exp_poly(_mm512_sub_ps(s[z], nw)));
    __m512 p1 = _mm512_maskz_mov_ps(mk[z + 1], exp_poly(_mm512_sub_ps(s[z + 1], nw)));
    total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
    _mm512_storeu_si512(pp + 8 * z, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
  }
  *sum = *sum * alpha + _mm512_reduce_add_ps(total);
  return alpha;
}

// acc rows o[4] (dv floats each) = o * alpha + P . V over one key block (pp [4][KB/2]), for
// value dims [d0, d0 + 16 NZ): NZ is a constant so the 4 x NZ accumulators stay in registers.
template <int NZ>
static inline void prefill_values_part(float* const* o, const float* alpha, const uint32_t* pp, const uint16_t* vp,
                                       int dv, int d0) {
  __m512 a[4][NZ];
  for (int r = 0; r < 4; ++r)
    for (int z = 0; z < NZ; ++z) a[r][z] = _mm512_mul_ps(_mm512_loadu_ps(o[r] + d0 + 16 * z), _mm512_set1_ps(alpha[r]));
  for (int k = 0; k < KB / 2; ++k) {
    __m512i v[NZ];
    for (int z = 0; z < NZ; ++z) v[z] = _mm512_loadu_si512(vp + (k * dv + d0 + 16 * z) * 2);
    for (int r = 0; r < 4; ++r) {
      __m512i pb = _mm512_set1_epi32((int)pp[r * (KB / 2) + k]);
      for (int z = 0; z < NZ; ++z) a[r][z] = _mm512_dpbf16_ps(a[r][z], as_bh(pb), as_bh(v[z]));
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(o[r] + d0 + 16 * z, a[r][z]);
}

static inline void prefill_values(float* const* o, const float* alpha, const uint32_t* pp, const uint16_t* vp, int dv) {
  int d0 = 0;
  for (; d0 + 64 <= dv; d0 += 64) prefill_values_part<4>(o, alpha, pp, vp, dv, d0);
  if (dv - d0 == 48) prefill_values_part<3>(o, alpha, pp, vp, dv, d0);
  if (dv - d0 == 32) prefill_values_part<2>(o, alpha, pp, vp, dv, d0);
  if (dv - d0 == 16) prefill_values_part<1>(o, alpha, pp, vp, dv, d0);
}

// Rows [i0, i1) (i1 - i0 <= RB) of head h against every key block of the span they see.
static void prefill_item(const PrefillJob& j, int h, int i0, int i1, uint32_t* qp, float* dummy) {
  const int rows = i1 - i0, padded = (rows + RG - 1) / RG * RG, P = j.P;
  const int64_t last = j.first + i1 - 1;  // the position of the item's last row
  if (last < j.key_start) return;
  for (int r = 0; r < padded; ++r)
    query_pairs(j, r < rows ? j.q + ((int64_t)(i0 + r) * j.H + h) * (j.dn + j.dr) : nullptr, qp + r * P);
  const int kb_end = (int)std::min<int64_t>(j.nkb, (last - j.key_start) / KB + 1);
  float sc[RG * KB];
  uint32_t pp[RG * (KB / 2)];
  float alpha[RG];
  float* o[RG];
  for (int kb = 0; kb < kb_end; ++kb) {
    const int64_t k0 = j.key_start + (int64_t)kb * KB;  // the block's first key position
    const uint16_t* kp = j.kp + ((int64_t)h * j.nkb + kb) * P * KB * 2;
    const uint16_t* vp = j.vp + ((int64_t)h * j.nkb + kb) * (KB / 2) * j.dvp * 2;
    for (int g = 0; g < padded; g += RG) {
      if (j.first + i0 + std::min(g + RG, rows) - 1 < k0) continue;  // the whole group sits before the block
      prefill_scores(qp + g * P, kp, P, sc);
      for (int r = 0; r < RG; ++r) {
        const int64_t i = i0 + g + r, pos = j.first + i;
        if (g + r >= rows || pos < k0) {  // not a row, or no key of this block visible: unchanged
          alpha[r] = 1.0f, o[r] = dummy;
          for (int k = 0; k < KB / 2; ++k) pp[r * (KB / 2) + k] = 0;
          continue;
        }
        const int nv = (int)std::min<int64_t>(KB, pos - k0 + 1);
        const int64_t s = i * j.H + h;
        alpha[r] = prefill_softmax(sc + r * KB, nv, j.scale, j.m + s, j.l + s, pp + r * (KB / 2));
        o[r] = j.acc + s * j.dvp;
      }
      prefill_values(o, alpha, pp, vp, j.dvp);
    }
  }
}

static void prefill_run(PrefillJob& j, int nthreads) {
  const int items_per_head = (j.n + RB - 1) / RB;
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t it = 0; it < (int64_t)j.H * j.nkb; ++it) prefill_pack(j, (int)(it / j.nkb), (int)(it % j.nkb));
    std::vector<uint32_t> qp((size_t)RB * j.P);
    std::vector<float> dummy(j.dvp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < (int64_t)j.H * items_per_head; ++it) {
      int h, b;
      prefill_item_of(it, items_per_head, &h, &b);
      prefill_item(j, h, b * RB, std::min(j.n, (b + 1) * RB), qp.data(), dummy.data());
    }
  }
}

// The job of one prefill span as the entry checked it (mla_paths.h PrefillSpan), less its buffers
// (prefill_buffers: after mla_prefill_amx.h amx_layout, where the AMX kernel runs it).
static PrefillJob prefill_job(const PrefillSpan& p) {
  PrefillJob job;
  job.n = (int)p.n, job.H = (int)p.H, job.dn = (int)p.dn, job.dr = (int)p.dr, job.dv = (int)p.dv, job.dvp = (int)p.dvp;
  job.S = (int)p.S, job.pn = (int)(p.dn + 1) / 2, job.P = job.pn + (int)p.dr / 2, job.nkb = (int)(p.S / KB);
  job.krs = (int)(p.groups * p.dr), job.hpg = (int)(p.H / p.groups);
  job.kvh = (int)p.kvh, job.hpk = (int)(p.H / p.kvh);
  job.first = p.first, job.key_start = p.key_start, job.scale = p.scale;
  job.q = (const uint16_t*)p.q, job.kv = (const uint16_t*)p.kv, job.kr = (const uint16_t*)p.kr;
  job.m = p.m, job.l = p.l, job.acc = p.acc;
  return job;
}

// The job's packed keys (unless read in place) and values: kept between calls (every span of every layer),
// one pair a thread and unit; fresh ones were zero-filled and page-faulted in each time, ~20% of an 8K
// prefill in the kernel's page clearing.
static void prefill_buffers(PrefillJob& job) {
  thread_local std::vector<uint16_t> kp, vp;
  if (!job.keys_in_place && kp.size() < (size_t)job.H * job.S * job.P * 2) kp.resize((size_t)job.H * job.S * job.P * 2);
  if (vp.size() < (size_t)job.H * job.S * job.dvp) vp.resize((size_t)job.H * job.S * job.dvp);
  job.kp = kp.data(), job.vp = vp.data();
}
