// Integer-dot linears y = x · Wᵀ with int8 activations (w4a8, w4a8_g128: int4 weights; w8a8: int8
// weights), one instruction set. Included by each qlinear_<isa>.cpp inside `namespace <isa>` after
// qlinear_impl.h (BLOCK, Vec with mul, store_lanes; qlinear_common.h: DOT_SUB) and that namespace's
// quantize_group and weight formats W4 (groups of 32), W4G (of 128), W8, each giving
//   SUBS (sub-blocks of 32 inputs a group), SUB (code bytes a sub-block), REC (bytes a record), MIN (a min
//   term follows the scales), scale(rec, lane) and min(rec, lane) -> Vec::T: the W rows lane.. of the
//   record's scales d_w (and mins m_w) as floats,
//   Codes, codes(sub, lane): the W rows lane.. of a sub-block's codes as `add` reads them (taken once
//                            per sub-block for all the activation rows of a pass),
//   Int, first(xsum), add(acc, codes, xq), to_float(acc): for those rows, the exact integer dot product
//        of the group's codes with its int8 activations, a sub-block (32 inputs xq) at a time (xsum: the
//        group's code sum), as an integer vector, then floats.
// Nothing here may include a header.
//
// Activations (quantized by quantize_rows below, one row at a time): per row and group (32 or 128
// inputs, the weight's) int8 codes q_x = round(x * 127 / max|x|) (-127..127), d_x = max|x| / 127,
// s_x = d_x * sum(q_x) and the integer sum(q_x) itself.
// Packed weights (kernels/qlinear.py pack_w4a8 / pack_w8a8): output rows in blocks of 16, one record
// per (block, group): the 16 rows' codes as SUBS sub-blocks of 32 inputs, then [16] scale d_w and (w4a8)
// [16] min m_w: float16 for w4a8 (Q4_1's 5 bits a weight on groups of 32, 4.25 on 128; widened exactly),
// float32 for w8a8.
// Each output element reduces in this fixed order:
//   for each group g: tot = fma(float(isum_g), d_w * d_x, tot); w4a8: tot = fma(m_w, s_x, tot)
// isum_g is an integer (exact, whatever order the SIMD lanes and sub-blocks add it in) and every float
// step is one IEEE operation per output element, the same whatever M, the thread split or the ISA (the
// scalar path gives the same bits): batch-invariant by construction.

// Activation rows per pass: with AVX-512's 32 registers a sub-block's codes, 8 rows' totals and their
// integer sums fit, so each code transpose (qlinear_dot_vnni.h `codes`) feeds twice the rows; AVX2's 16 hold 4.
constexpr int DOT_MB = Vec::W == 16 ? 8 : 4;
// The records stream from memory once a step: each is prefetched into L2 (prefetcht1: the L1's few
// fill buffers held too few lines in flight) this many bytes ahead, past the end of its block too (the
// next block's records follow). On the AMX Xeon, `bench kernel --moe 1024x512x64x6+1 --moe-weights w4a8`
// (layers cycled from memory): 8 / 32 tokens 2.35 / 5.31 ms a layer against 2.81 / 5.53 ms at four
// records ahead into L1 (4 KB and 16 KB ahead, or into L3, did no better).
constexpr int64_t DOT_STREAM_AHEAD = 8192;

// P panels (W rows each: panel i is packed panel first + i, output columns (first + i) * W ...)
// times MB activation rows over all G groups. xq [MB rows, stride ldq] int8, xd / xs / xi [MB rows][G].
template <class D, int P, int MB>
static inline void dot_panels(const uint8_t* __restrict packed, int64_t G, int64_t first, const int8_t* __restrict xq,
                              int64_t ldq, const float* __restrict xd, const float* __restrict xs,
                              const int32_t* __restrict xi, float* __restrict out, int64_t ldo, int64_t N) {
  constexpr int W = Vec::W, PB = BLOCK / W;
  const uint8_t* base[P];
  int lane[P];
  for (int p = 0; p < P; ++p) {
    base[p] = packed + (first + p) / PB * G * D::REC;
    lane[p] = (int)((first + p) % PB) * W;
  }
  typename Vec::T tot[P][MB];
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MB; ++m) tot[p][m] = Vec::zero();
  for (int64_t g = 0; g < G; ++g) {
    for (int p = 0; p < P; ++p)
      if (lane[p] == 0)
        for (int line = 0; line < D::REC; line += 64) __builtin_prefetch(base[p] + g * D::REC + DOT_STREAM_AHEAD + line, 0, 2);
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {  // unrolled: the totals stay in registers
      const uint8_t* rec = base[p] + g * D::REC;
      typename D::Int acc[MB];
      for (int m = 0; m < MB; ++m) acc[m] = D::first(xi[m * G + g]);
      for (int s = 0; s < D::SUBS; ++s) {  // the group's integer sums: exact, so any order of the sub-blocks
        const typename D::Codes codes = D::codes(rec + s * D::SUB, lane[p]);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) acc[m] = D::add(acc[m], codes, xq + m * ldq + (g * D::SUBS + s) * DOT_SUB);
      }
      const typename Vec::T scale = D::scale(rec, lane[p]);
      const typename Vec::T mins = D::MIN ? D::min(rec, lane[p]) : Vec::zero();
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        tot[p][m] = Vec::fma(D::to_float(acc[m]), Vec::mul(scale, Vec::set1(xd[m * G + g])), tot[p][m]);
        if constexpr (D::MIN) tot[p][m] = Vec::fma(mins, Vec::set1(xs[m * G + g]), tot[p][m]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MB; ++m) store_lanes(out + m * ldo, (first + p) * W, N, tot[p][m]);  // qlinear_impl.h
}

// One unit of U blocks (16 U output rows) times all M rows, in passes of DOT_MB rows (the rest: 4 where
// DOT_MB is 8, then 3, 2, 1) over one block at a time: its records stream in order, and the totals fit the registers.
template <class D, int U>
static void dot_unit(const uint8_t* packed, int64_t G, int64_t block, const int8_t* xq, int64_t M, int64_t ldq,
                     const float* xd, const float* xs, const int32_t* xi, float* out, int64_t ldo, int64_t N) {
  constexpr int PB = BLOCK / Vec::W;
  const int64_t first = block * PB;
  int64_t m = 0;
  for (; m + DOT_MB <= M; m += DOT_MB)
    for (int u = 0; u < U; ++u)
      dot_panels<D, PB, DOT_MB>(packed, G, first + u * PB, xq + m * ldq, ldq, xd + m * G, xs + m * G, xi + m * G,
                                out + m * ldo, ldo, N);
  const auto at = [&](auto rows) {
    for (int u = 0; u < U; ++u)
      dot_panels<D, PB, decltype(rows)::value>(packed, G, first + u * PB, xq + m * ldq, ldq, xd + m * G, xs + m * G,
                                               xi + m * G, out + m * ldo, ldo, N);
  };
  if constexpr (DOT_MB > 4)
    if (M - m >= 4) at(std::integral_constant<int, 4>{}), m += 4;
  switch (M - m) {
    case 3: at(std::integral_constant<int, 3>{}); break;
    case 2: at(std::integral_constant<int, 2>{}); break;
    case 1: at(std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

// Work units of a dot linear with N outputs: DOT_U blocks each (the packed rows are a multiple of
// 64: a unit never runs past them).
constexpr int DOT_U = 2;
static inline int64_t dot_unit_count(int64_t N) { return ((N + BLOCK - 1) / BLOCK + DOT_U - 1) / DOT_U; }

// Units u0..u1 of y [M, N] (stride ldo) from the quantized activations (xq [M, G*32] stride ldq, xd /
// xs / xi [M, G]); any split gives the same bits (qlinear.cpp splits them over threads, moe.h over
// (expert, unit) items).
template <class D>
static void dot_units(const uint8_t* packed, int64_t G, const int8_t* xq, int64_t M, int64_t ldq, const float* xd,
                      const float* xs, const int32_t* xi, float* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1) {
  for (int64_t u = u0; u < u1; ++u) dot_unit<D, DOT_U>(packed, G, u * DOT_U, xq, M, ldq, xd, xs, xi, out, ldo, N);
}

// x [M rows, stride ldx] float32 (zeros past K, G groups of `group` inputs a row) -> codes q [M, group G],
// d_x, s_x and sum(q_x) [M, G].
static void quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t G, int64_t group, int8_t* q, float* d,
                          float* s, int32_t* qs) {
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      for (int64_t g = 0; g < G; ++g) {
        int32_t sum;
        const float dx = quantize_group(x + m * ldx + g * group, q + (m * G + g) * group, &sum, (int)group) / 127.0f;
        d[m * G + g] = dx, s[m * G + g] = dx * (float)sum, qs[m * G + g] = sum;
      }
  });
}
