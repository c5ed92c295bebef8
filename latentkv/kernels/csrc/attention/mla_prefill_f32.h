// Batch-invariant MLA prefill attention in float32 FMAs, one template for every vector width:
// included by attention_<isa>.cpp inside each ISA's namespace (after exp_poly.h) and instantiated at
// that ISA's width W: 16 lanes (avx512), 8 (avx2 + fma), 4 (the baseline: sse2 on x86-64). The
// code is written with GCC vector types, so one source is every path (the avx512 one is the
// avx2 one at twice the width, not separate hand-written code). No header includes here.
//
// The contract of mla_prefill_bf16.h (attention/prefill.py span_prefill): one call attends rows
// of one sequence's prompt to one span of its keys and updates each row's float32 online-softmax
// state (running max m, sum l, unnormalized output acc) in place. A row visits its keys in blocks
// of KB at absolute positions, in order, each block with the same arithmetic whichever rows,
// thread or span share the call: a row's bits depend only on its query, its position and the
// keys (batch-invariant by design).
//   q   [n, H, dn + dr]  T (float32, or bf16 widened when packed), row i at position first + i
//   kv  [S, H, dn + dv]  T: kv_b_proj of the span's latents (k_nope, then v, per head)
//       or [S, Hk, dn + dv] one per group of hpk = H / Hk consecutive heads (equal kv_b_proj rows)
//   k_r [S, dr]          T: the span's rotated rope keys, one for all heads; key t at key_start + t
//       or [S, G, dr]    one per group of hpg = H / G consecutive heads (grouped rope keys, model/rope_groups.py)
//   m, l [n, H], acc [n, H, dvp] float32 (dv padded to a multiple of 16; the pad stays 0)
// Scores: q . k summed in float32 in element order (one FMA chain per lane), times the softmax
// scale. Values: the float32 probabilities times v, summed in key order.

template <int W>
struct F32Vec {
  typedef float type __attribute__((vector_size(4 * W)));
  typedef int32_t itype __attribute__((vector_size(4 * W)));
};

constexpr int F32_KB = PREFILL_KB;  // keys per block (absolute positions), as the bf16 kernel (mla_job.h)
constexpr int F32_RG = 6;   // query rows per micro-kernel
constexpr int F32_RB = 60;  // query rows per work item (a multiple of RG): their state stays in L1

// Score and value micro-kernel widths in vectors: RG x Z accumulators fit the register file
// (16 vector registers below avx512, 32 with it), plus Z loads and a broadcast.
template <int W> constexpr int f32_score_z() { return W == 16 ? 4 : 2; }
template <int W> constexpr int f32_value_z() { return W == 16 ? 4 : 2; }

template <typename T>
struct F32PrefillJob {
  int n, H, dn, dr, dv, dvp, D, S, nkb;  // D = dn + dr
  int krs, hpg;                           // k_r's row stride (G * dr), heads per rope key (H / G)
  int kvh, hpk;                           // kv's heads (Hk) and heads per kv head (H / Hk)
  int64_t first, key_start;
  float scale;
  const T* q;
  const T* kv;
  const T* kr;
  float* kp;  // [H, nkb] blocks of keys: [KB / KC][D][KC], lanes = keys (KC: one score pass's keys)
  float* vp;  // [H, nkb] blocks of values: per value-dim chunk of f32_values, [KB][chunk] (0 past dv)
  float *m, *l, *acc;
};

static inline float f32_widen(float x) { return x; }
static inline float f32_widen(uint16_t x) { return __builtin_bit_cast(float, (uint32_t)x << 16); }

template <int W>
static inline typename F32Vec<W>::type f32_load(const float* p) {
  typename F32Vec<W>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <int W>
static inline void f32_store(float* p, typename F32Vec<W>::type v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

template <int W>
static inline typename F32Vec<W>::type f32_splat(float x) {  // (V{} + x would add 0.0f first: one more op)
  return x - typename F32Vec<W>::type{};
}

// Block kb of head h, laid out so that each micro-kernel pass reads one contiguous stream.
template <int W, typename T>
static void f32_pack(const F32PrefillJob<T>& j, int h, int kb) {
  constexpr int KC = f32_score_z<W>() * W, VC = f32_value_z<W>() * W;
  float* kp = j.kp + ((int64_t)h * j.nkb + kb) * j.D * F32_KB;
  float* vp = j.vp + ((int64_t)h * j.nkb + kb) * F32_KB * j.dvp;
  const int full = j.dvp / VC * VC;  // value dims in VC-wide chunks, then W-wide ones (f32_values)
  for (int k = 0; k < F32_KB; ++k) {
    const int64_t t = (int64_t)kb * F32_KB + k;
    const T* row = j.kv + (t * j.kvh + h / j.hpk) * (j.dn + j.dv);
    float* kc = kp + (k / KC) * j.D * KC + k % KC;
    for (int e = 0; e < j.dn; ++e) kc[e * KC] = f32_widen(row[e]);
    const T* kr = j.kr + t * j.krs + (int64_t)(h / j.hpg) * j.dr;
    for (int e = 0; e < j.dr; ++e) kc[(j.dn + e) * KC] = f32_widen(kr[e]);
    for (int d = 0; d < j.dvp; ++d) {
      const int d0 = d < full ? d / VC * VC : full + (d - full) / W * W, cw = d < full ? VC : W;
      vp[d0 * F32_KB + k * cw + d - d0] = d < j.dv ? f32_widen(row[j.dn + d]) : 0.0f;
    }
  }
}

// Scores of RG query rows (qr [RG, D]) against one key block (kp, f32_pack's layout): sc [RG, KB], unscaled.
// Per key element: Z loads, RG broadcasts, RG x Z FMAs; each lane sums its key's products in order.
template <int W>
static inline void f32_scores(const float* qr, const float* kp, int D, float* sc) {
  typedef typename F32Vec<W>::type V;
  constexpr int Z = f32_score_z<W>();
  for (int k0 = 0; k0 < F32_KB; k0 += Z * W) {
    const float* kc = kp + k0 * D;  // this pass's [D][Z W] keys
    V a[F32_RG][Z];
#pragma GCC unroll 16
    for (int r = 0; r < F32_RG; ++r)
#pragma GCC unroll 4
      for (int z = 0; z < Z; ++z) a[r][z] = V{};
    for (int e = 0; e < D; ++e) {
      V k[Z];
#pragma GCC unroll 4
      for (int z = 0; z < Z; ++z) k[z] = f32_load<W>(kc + (e * Z + z) * W);
#pragma GCC unroll 16
      for (int r = 0; r < F32_RG; ++r) {
        const V qb = f32_splat<W>(qr[r * D + e]);
#pragma GCC unroll 4
        for (int z = 0; z < Z; ++z) a[r][z] += qb * k[z];
      }
    }
    for (int r = 0; r < F32_RG; ++r)
      for (int z = 0; z < Z; ++z) f32_store<W>(sc + r * F32_KB + k0 + z * W, a[r][z]);
  }
}

// One row's online-softmax step over a block with nv visible keys: updates *mx, *sum; the
// probabilities p [KB] (0 past nv); returns alpha, the rescale of the row's earlier acc.
template <int W>
static inline float f32_softmax(const float* sc, int nv, float scale, float* mx, float* sum, float* p) {
  typedef typename F32Vec<W>::type V;
  typedef typename F32Vec<W>::itype I;
  constexpr int Z = F32_KB / W;
  const V ninf = V{} - __builtin_inff();
  I lane;
  for (int i = 0; i < W; ++i) lane[i] = i;
  V s[Z];
  I vis[Z];
  V t = ninf;
  for (int z = 0; z < Z; ++z) {
    vis[z] = lane + z * W < nv;
    s[z] = vis[z] ? f32_load<W>(sc + z * W) * scale : ninf;
    t = t > s[z] ? t : s[z];
  }
  float tmax = t[0];
  for (int i = 1; i < W; ++i) tmax = t[i] > tmax ? t[i] : tmax;
  const float old = *mx, now = tmax > old ? tmax : old;
  const float alpha = exp_poly(old - now);  // 1 when the max holds; ~0 from -inf (acc and sum are 0 then)
  *mx = now;
  V total = V{};
  for (int z = 0; z < Z; ++z) {
    const V pz = vis[z] ? exp_poly(s[z] - now) : V{};
    total += pz;
    f32_store<W>(p + z * W, pz);
  }
  float add = total[0];
  for (int i = 1; i < W; ++i) add += total[i];
  *sum = *sum * alpha + add;
  return alpha;
}

// acc rows o[RG] = o * alpha + P . V over one key block (p [RG, KB]), for value dims
// [d0, d0 + NZ W) (vp: their [KB][NZ W] chunk): NZ is a constant so the accumulators stay in registers.
template <int W, int NZ>
static inline void f32_values_part(float* const* o, const float* alpha, const float* p, const float* vp, int d0) {
  typedef typename F32Vec<W>::type V;
  V a[F32_RG][NZ];
#pragma GCC unroll 16
  for (int r = 0; r < F32_RG; ++r)
#pragma GCC unroll 4
    for (int z = 0; z < NZ; ++z) a[r][z] = f32_load<W>(o[r] + d0 + z * W) * alpha[r];
  for (int k = 0; k < F32_KB; ++k) {
    V v[NZ];
#pragma GCC unroll 4
    for (int z = 0; z < NZ; ++z) v[z] = f32_load<W>(vp + (k * NZ + z) * W);
#pragma GCC unroll 16
    for (int r = 0; r < F32_RG; ++r) {
      const V pb = f32_splat<W>(p[r * F32_KB + k]);
#pragma GCC unroll 4
      for (int z = 0; z < NZ; ++z) a[r][z] += pb * v[z];
    }
  }
  for (int r = 0; r < F32_RG; ++r)
    for (int z = 0; z < NZ; ++z) f32_store<W>(o[r] + d0 + z * W, a[r][z]);
}

template <int W>
static inline void f32_values(float* const* o, const float* alpha, const float* p, const float* vp, int dvp) {
  constexpr int Z = f32_value_z<W>();
  int d0 = 0;
  for (; d0 + Z * W <= dvp; d0 += Z * W) f32_values_part<W, Z>(o, alpha, p, vp + d0 * F32_KB, d0);
  for (; d0 < dvp; d0 += W) f32_values_part<W, 1>(o, alpha, p, vp + d0 * F32_KB, d0);  // dvp % W == 0 (16 | dvp)
}

// Rows [i0, i1) (i1 - i0 <= RB) of head h against every key block of the span they see.
// qr: scratch [RB, D]; dummy: [dvp], the acc of rows that are not rows.
template <int W, typename T>
static void f32_item(const F32PrefillJob<T>& j, int h, int i0, int i1, float* qr, float* dummy) {
  const int rows = i1 - i0, padded = (rows + F32_RG - 1) / F32_RG * F32_RG, D = j.D;
  const int64_t last = j.first + i1 - 1;  // the position of the item's last row
  if (last < j.key_start) return;
  for (int r = 0; r < padded; ++r)
    for (int e = 0; e < D; ++e)
      qr[r * D + e] = r < rows ? f32_widen(j.q[((int64_t)(i0 + r) * j.H + h) * D + e]) : 0.0f;
  const int kb_end = (int)std::min<int64_t>(j.nkb, (last - j.key_start) / F32_KB + 1);
  float sc[F32_RG * F32_KB], p[F32_RG * F32_KB], alpha[F32_RG];
  float* o[F32_RG];
  for (int kb = 0; kb < kb_end; ++kb) {
    const int64_t k0 = j.key_start + (int64_t)kb * F32_KB;  // the block's first key position
    const float* kp = j.kp + ((int64_t)h * j.nkb + kb) * D * F32_KB;
    const float* vp = j.vp + ((int64_t)h * j.nkb + kb) * F32_KB * j.dvp;
    for (int g = 0; g < padded; g += F32_RG) {
      if (j.first + i0 + std::min(g + F32_RG, rows) - 1 < k0) continue;  // the whole group sits before the block
      f32_scores<W>(qr + g * D, kp, D, sc);
      for (int r = 0; r < F32_RG; ++r) {
        const int64_t i = i0 + g + r, pos = j.first + i;
        if (g + r >= rows || pos < k0) {  // not a row, or no key of this block visible: unchanged
          alpha[r] = 1.0f, o[r] = dummy;
          for (int k = 0; k < F32_KB; ++k) p[r * F32_KB + k] = 0.0f;
          continue;
        }
        const int nv = (int)std::min<int64_t>(F32_KB, pos - k0 + 1);
        const int64_t s = i * j.H + h;
        alpha[r] = f32_softmax<W>(sc + r * F32_KB, nv, j.scale, j.m + s, j.l + s, p + r * F32_KB);
        o[r] = j.acc + s * j.dvp;
      }
      f32_values<W>(o, alpha, p, vp, j.dvp);
    }
  }
}

template <int W, typename T>
static void f32_prefill_run(F32PrefillJob<T>& j, int nthreads) {
  const int items_per_head = (j.n + F32_RB - 1) / F32_RB;
#pragma omp parallel num_threads(nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t it = 0; it < (int64_t)j.H * j.nkb; ++it) f32_pack<W>(j, (int)(it / j.nkb), (int)(it % j.nkb));
    std::vector<float> qr((size_t)F32_RB * j.D), dummy(j.dvp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < (int64_t)j.H * items_per_head; ++it) {
      int h, b;
      prefill_item_of(it, items_per_head, &h, &b);
      f32_item<W>(j, h, b * F32_RB, std::min(j.n, (b + 1) * F32_RB), qr.data(), dummy.data());
    }
  }
}

// One prefill span as the entry checked it (mla_paths.h PrefillSpan) through this kernel at width W, on
// its tensors' element type.
template <int W, typename T>
static void f32_prefill_span(const PrefillSpan& p) {
  F32PrefillJob<T> job{};
  job.n = (int)p.n, job.H = (int)p.H, job.dn = (int)p.dn, job.dr = (int)p.dr, job.dv = (int)p.dv, job.dvp = (int)p.dvp;
  job.krs = (int)(p.groups * p.dr), job.hpg = (int)(p.H / p.groups);
  job.kvh = (int)p.kvh, job.hpk = (int)(p.H / p.kvh);
  job.D = (int)(p.dn + p.dr), job.S = (int)p.S, job.nkb = (int)(p.S / F32_KB);
  job.first = p.first, job.key_start = p.key_start, job.scale = p.scale;
  job.q = (const T*)p.q, job.kv = (const T*)p.kv, job.kr = (const T*)p.kr;
  std::vector<float> kp((size_t)p.H * p.S * job.D), vp((size_t)p.H * p.S * job.dvp);
  job.kp = kp.data(), job.vp = vp.data();
  job.m = p.m, job.l = p.l, job.acc = p.acc;
  f32_prefill_run<W, T>(job, p.threads);
}
template <int W>
static void f32_prefill(const PrefillSpan& p) {
  if (p.bf16) f32_prefill_span<W, uint16_t>(p);
  else f32_prefill_span<W, float>(p);
}
