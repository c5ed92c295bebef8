// Weight-only quantized linear y = x · Wᵀ, one instruction set. Included once per ISA by its qlinear_<isa>.cpp
// inside `namespace <isa>` under `#pragma GCC target(...)`, after that namespace's `struct Vec`
// (W float lanes: zero, load, store, set1, fma, nibble, byte). Nothing here may include a header.
//
// Packed weights (built by kernels/qlinear.py): output rows in blocks of 16, one record per
// (block, group of 32 inputs), int32 words:
//   int4: [4 words][16 rows] codes q (0..15), 8 nibbles a word (nibble t of word j = input 8j + t),
//         then [16] scale, [16] min (= zero - 8 * scale: w = q * scale + min) as float32 bits;
//   int8: [32 inputs][16 rows] int8 codes, then [16] scale (the row's scale, repeated per group).
// An int4 code is taken as `word & (15 << 4t)`, i.e. q * 16^t (t = 7: `word >> 28`, q), one op
// fewer than shifting it down; the caller scales x by 16^-t to match (x', exact: a power of two),
// so code * x' is exactly q * x.
// The rows of a block sit in the SIMD lanes, so every lane (output element) runs the same
// instructions as a scalar loop would. Each output element reduces in this fixed order:
//   for each group g: acc = sum over the 32 inputs in order of fma(code, x', acc)
//                     tot = fma(acc, scale, tot); int4: tot = fma(min, sum(x over g), tot)
// whatever M, the thread split, the ISA (the scalar path uses fmaf: the same bits), or whether
// the codes come straight from the packed record ("direct", M < TILE_MIN) or from blocks
// dequantized into a float tile that a block of rows reuses ("tile", blocked like a GEMM; float32
// weights are read as packed, and their scale of 1 makes the tot step an add, the same rounding):
// batch-invariant by construction.

constexpr int BLOCK = 16;  // output rows per packed block
constexpr int GROUP = 32;  // inputs per group (quant.py INT4_GROUP)

struct Int4 {
  static constexpr bool PAIRS = false;
  static constexpr bool UNIT = false;  // true: every scale is 1.0 (the tile path adds instead)
  static constexpr int REC = 4 * BLOCK + 2 * BLOCK;  // words per record
  static constexpr int SCALE = 4 * BLOCK;
  static constexpr bool ZERO = true;
  static inline Vec::T code(const int32_t* rec, int lane, int k) { return Vec::nibble(rec + (k >> 3) * BLOCK + lane, k & 7); }
};

struct Int8 {
  static constexpr bool PAIRS = false;
  static constexpr bool UNIT = false;
  static constexpr int REC = GROUP * BLOCK / 4 + BLOCK;
  static constexpr int SCALE = GROUP * BLOCK / 4;
  static constexpr bool ZERO = false;
  static inline Vec::T code(const int32_t* rec, int lane, int k) {
    return Vec::byte(reinterpret_cast<const int8_t*>(rec) + k * BLOCK + lane);
  }
};

// Plain float32 weights (no quantization): [32 inputs][16 rows] float32, then 16 scales of 1.0, so
// a float32 linear reduces in the same fixed order as the quantized ones (batch-invariant; used for
// float32 nn.Linear layers in batch-invariant mode, where MKL's small-M kernels round differently).
struct F32 {
  static constexpr bool PAIRS = false;
  static constexpr bool UNIT = true;  // every scale is 1.0
  static constexpr int REC = GROUP * BLOCK + BLOCK;
  static constexpr int SCALE = GROUP * BLOCK;
  static constexpr bool ZERO = false;
  static inline Vec::T code(const int32_t* rec, int lane, int k) {
    return Vec::load(reinterpret_cast<const float*>(rec) + k * BLOCK + lane);
  }
};

// Plain bf16 weights: per record 16 words for each pair of inputs (2j, 2j + 1): [16 pairs][16 rows]
// words of two bf16 (input 2j in the low half), then 16 scales of 1.0. The FMA paths widen one
// half of a word (exact) and reduce in the float32 record's order; with Vec::DPBF16 a word is one
// vdpbf16ps operand (both inputs of the pair in one instruction). Batch-invariant mode's bf16
// linears: oneDNN picks its bf16 kernels by M and CPU, and on AMX a row's bits change with M.
struct BF16 {
  static constexpr bool UNIT = true;
  static constexpr bool PAIRS = true;
  static constexpr int REC = GROUP * BLOCK / 2 + BLOCK;
  static constexpr int SCALE = GROUP * BLOCK / 2;
  static constexpr bool ZERO = false;
  static inline Vec::T code(const int32_t* rec, int lane, int k) {
    const int32_t* w = rec + (k >> 1) * BLOCK + lane;
    return (k & 1) ? Vec::bf16_hi(w) : Vec::bf16_lo(w);
  }
};

// A block dequantized to float codes (q * 16^t for int4, q for int8): [32 inputs][16 rows] floats, then scale and zero.
template <class F>
struct Tile {
  static constexpr bool PAIRS = false;
  static constexpr bool UNIT = false;
  static constexpr int REC = GROUP * BLOCK + 2 * BLOCK;
  static constexpr int SCALE = GROUP * BLOCK;
  static constexpr bool ZERO = F::ZERO;
  static inline Vec::T code(const int32_t* rec, int lane, int k) {
    return Vec::load(reinterpret_cast<const float*>(rec) + k * BLOCK + lane);
  }
};

template <class T>
static inline T* align64(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

// A vector of W output columns from n (only those < N: the last panel may be partly padding).
static inline void store_lanes(float* row, int64_t n, int64_t N, typename Vec::T v) {
  constexpr int W = Vec::W;
  if (n >= N) return;
  if (n + W <= N) {
    Vec::store(row + n, v);
    return;
  }
  alignas(64) float tmp[W];
  Vec::store(tmp, v);
  for (int64_t i = 0; n + i < N; ++i) row[n + i] = tmp[i];
}

// Activation elements per group: 32 floats, or for vdpbf16ps 16 words of two bf16 (x as pairs:
// `pair_rows` in qlinear_kernel.h), so a pair is one broadcast.
template <class F>
constexpr int x_step() { return Vec::DPBF16 && F::PAIRS ? GROUP / 2 : GROUP; }

// The fixed order's inner step, for P panels (records base[p] + g * F::REC, lanes lane[p]) times
// MB activation rows xg [MB rows, stride ldx] of group g: acc[p][m] = the fma chain over the 32
// inputs in order. The direct and the tile paths both run it, so their bits cannot drift apart.
template <class F, int P, int MB, class V = Vec>  // V: Vec, dependent so that only DPBF16 ISAs compile the pair branch
__attribute__((always_inline)) static inline void group_sums(const int32_t* const* base, const int* lane, int64_t g,
                                                              const float* __restrict xg, int64_t ldx,
                                                              typename Vec::T (&acc)[P][MB]) {
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MB; ++m) acc[p][m] = Vec::zero();
  if constexpr (V::DPBF16 && F::PAIRS) {  // bf16 pairs: one vdpbf16ps per pair, in input order
#pragma GCC unroll 16
    for (int j = 0; j < GROUP / 2; ++j) {
      typename V::T q[P];
      for (int p = 0; p < P; ++p) q[p] = V::words(base[p] + g * F::REC + j * BLOCK + lane[p]);
      for (int m = 0; m < MB; ++m) {
        const typename V::T xv = V::pair(xg + m * ldx + j);
        for (int p = 0; p < P; ++p) acc[p][m] = V::dp(q[p], xv, acc[p][m]);
      }
    }
    return;
  }
#pragma GCC unroll 32
  for (int k = 0; k < GROUP; ++k) {
    typename Vec::T q[P];
    for (int p = 0; p < P; ++p) q[p] = F::code(base[p] + g * F::REC, lane[p], k);
    for (int m = 0; m < MB; ++m) {
      const typename Vec::T xv = Vec::set1(xg[m * ldx + k]);
      for (int p = 0; p < P; ++p) acc[p][m] = Vec::fma(q[p], xv, acc[p][m]);
    }
  }
}

// P panels (W rows each: panel i is packed panel first + i, output columns col0 + i * W ...) times MB
// activation rows, over all G groups. x [MB rows, stride ldx] float32 (zero past K), xsum [MB rows][G];
// out rows stride ldo, only columns < N written. The records stream from memory with no software
// prefetch: the hardware's stream prefetchers do better (on Zen 4, prefetching four records ahead into
// L1 read a 32-token MoE step's experts at 0.8-0.9x the speed).
template <class F, int P, int MB>
static inline void panels(const int32_t* __restrict packed, int64_t G, int64_t first, int64_t col0,
                          const float* __restrict x, int64_t ldx, const float* __restrict xsum, float* __restrict out,
                          int64_t ldo, int64_t N) {
  constexpr int W = Vec::W, PB = BLOCK / W;
  const int32_t* base[P];
  int lane[P];
  for (int p = 0; p < P; ++p) {
    base[p] = packed + (first + p) / PB * G * F::REC;
    lane[p] = (int)((first + p) % PB) * W;
  }
  typename Vec::T tot[P][MB];
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MB; ++m) tot[p][m] = Vec::zero();
  for (int64_t g = 0; g < G; ++g) {
    typename Vec::T acc[P][MB];
    group_sums<F, P, MB>(base, lane, g, x + g * x_step<F>(), ldx, acc);
    for (int p = 0; p < P; ++p) {
      const float* rec = reinterpret_cast<const float*>(base[p] + g * F::REC) + F::SCALE + lane[p];
      const typename Vec::T scale = Vec::load(rec);
      for (int m = 0; m < MB; ++m) tot[p][m] = Vec::fma(acc[p][m], scale, tot[p][m]);
      if constexpr (F::ZERO) {
        const typename Vec::T zero = Vec::load(rec + BLOCK);
        for (int m = 0; m < MB; ++m) tot[p][m] = Vec::fma(zero, Vec::set1(xsum[m * G + g]), tot[p][m]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MB; ++m) store_lanes(out + m * ldo, col0 + p * W, N, tot[p][m]);
}

// Rows 0..rows in passes of up to MB rows, as even as they go (8 rows in passes of 6 are 4 + 4, not
// 6 + 2): fn(std::integral_constant<int, r>, first row) per pass, r its rows as a compile-time count.
template <int MB, class Fn>
static inline void row_passes(int64_t rows, Fn&& fn) {
  static_assert(MB >= 1 && MB <= 6, "passes of 1..6 rows");
  const int64_t passes = (rows + MB - 1) / MB;
  for (int64_t i = 0, m = 0; i < passes; ++i) {
    const int64_t r = rows / passes + (i < rows % passes);
    switch (r) {
      case 6: if constexpr (MB >= 6) fn(std::integral_constant<int, 6>{}, m); break;
      case 5: if constexpr (MB >= 5) fn(std::integral_constant<int, 5>{}, m); break;
      case 4: if constexpr (MB >= 4) fn(std::integral_constant<int, 4>{}, m); break;
      case 3: if constexpr (MB >= 3) fn(std::integral_constant<int, 3>{}, m); break;
      case 2: if constexpr (MB >= 2) fn(std::integral_constant<int, 2>{}, m); break;
      default: fn(std::integral_constant<int, 1>{}, m); break;
    }
    m += r;
  }
}

// M < TILE_MIN: the rows in row_passes of up to DIRECT_MB, codes read straight from the packed records;
// units of DIRECT_P panels (the packed rows are a multiple of 64, so a unit never runs past them). A pass
// of several rows runs the unit's panels in two halves, so that its accumulators and totals stay in
// registers; a unit's later passes read its records from L2. With 32 registers (AVX-512) a pass takes
// up to 6 rows: on Zen 4 a 32-token MoE step's experts of 4-11 rows read their weights ~1.5x faster this
// way than by the tile path, whose one block at a time keeps too few sums in flight to hide the dot
// product's latency.
template <class F, int P>
static void direct_unit(const int32_t* packed, int64_t G, int64_t first, const float* x, int64_t M, int64_t ldx,
                        const float* xsum, float* out, int64_t ldo, int64_t N) {
  constexpr int H = P / 2, W = Vec::W;
  if (M == 1) {
    panels<F, P, 1>(packed, G, first, first * W, x, ldx, xsum, out, ldo, N);
    return;
  }
  row_passes<DIRECT_MB>(M, [&](auto rows, int64_t m) {
    for (int h = 0; h < 2; ++h) {
      const int64_t f = first + h * H;
      panels<F, H, decltype(rows)::value>(packed, G, f, f * W, x + m * ldx, ldx, xsum + m * G, out + m * ldo, ldo, N);
    }
  });
}

// The many-row (tile) path, blocked like a BLIS GEMM so that each operand is read from a near cache:
// the rows in M blocks whose activations fill about half of L2 (X_BLOCK_BYTES), the output
// columns of a thread in chunks whose weights fit a slice of L3 (W_CHUNK_BYTES), and K in blocks
// of KC groups whose codes for one unit (16 KB: 256 inputs x 16 rows) stay in L1 across the row
// passes. `tot` lives in a small buffer between groups (an AVX2 register file cannot hold the 6 x 2
// accumulators and 6 x 2 totals of a pass); every output element still runs the fixed order
// above, group after group, whatever the blocking.
constexpr int KC = 8;                            // groups per k block
constexpr int64_t X_BLOCK_BYTES = 256 << 10;     // activation rows per M block: about this many bytes
constexpr int64_t W_CHUNK_BYTES = 4 << 20;       // a thread's output columns per chunk: about this many weight bytes

// MB activation rows times P panels (base[p] + g * S::REC, lanes lane[p]) over groups 0..gn of a k
// block: x [MB rows, stride ldx] at the block's first input, xsum [MB rows, stride G] at its first
// group, tot [MB rows, stride ldt] the running totals of the P panels (read and written once per group).
template <class S, int P, int MB>
static inline void tile_pass(const int32_t* const* base, const int* lane, int gn, const float* __restrict x, int64_t ldx,
                             const float* __restrict xsum, int64_t G, float* __restrict tot, int64_t ldt) {
  constexpr int W = Vec::W;
  for (int g = 0; g < gn; ++g) {
    typename Vec::T acc[P][MB];
    group_sums<S, P, MB>(base, lane, g, x + g * x_step<S>(), ldx, acc);
    for (int p = 0; p < P; ++p) {
      const float* rec = reinterpret_cast<const float*>(base[p] + g * S::REC) + S::SCALE + lane[p];
      const typename Vec::T scale = Vec::load(rec);
      for (int m = 0; m < MB; ++m) {
        float* t = tot + m * ldt + p * W;
        // float32 weights: scale 1, and fma(acc, 1, tot) is acc + tot (one rounding either way) on the adder
        typename Vec::T v = S::UNIT ? Vec::add(acc[p][m], Vec::load(t)) : Vec::fma(acc[p][m], scale, Vec::load(t));
        if constexpr (S::ZERO) v = Vec::fma(Vec::load(rec + BLOCK), Vec::set1(xsum[m * G + g]), v);
        Vec::store(t, v);
      }
    }
    // keep the totals in memory: hoisted into registers they would push the accumulators out
    __asm__ volatile("" ::: "memory");
  }
}

// Rows 0..rows of an M block (row_passes of up to MB rows) times P panels over one k block of gn groups.
template <class S, int P, int MB>
static void tile_rows(const int32_t* const* base, const int* lane, int gn, const float* x, int64_t ldx, const float* xsum,
                      int64_t G, int64_t rows, float* tot, int64_t ldt) {
  row_passes<MB>(rows, [&](auto r, int64_t m) {
    tile_pass<S, P, decltype(r)::value>(base, lane, gn, x + m * ldx, ldx, xsum + m * G, G, tot + m * ldt, ldt);
  });
}

// Units u0..u1 (TILE_BLOCKS blocks each) times all M rows: the blocked loops. Quantized weights are
// dequantized per (M block, unit, k block) into `tile` (TILE_BLOCKS x KC records of Tile<F>);
// float32 weights are read as they are packed. tot: MC x BLOCK * TILE_BLOCKS floats.
template <class F>
static void tile_units(const int32_t* packed, int64_t G, int64_t u0, int64_t u1, const float* x, int64_t M, int64_t ldx,
                       const float* xsum, float* out, int64_t ldo, int64_t N, int64_t MC, int64_t UC, int32_t* tile,
                       float* tot) {
  constexpr int W = Vec::W, PB = BLOCK / W, P = TILE_BLOCKS * PB, LDT = TILE_BLOCKS * BLOCK;
  static_assert(P % TILE_P == 0, "a unit's panels in whole micro tiles");
  constexpr bool DEQUANT = !F::UNIT;  // float32 / bf16 weights are read as packed
  const int64_t nbn = (N + BLOCK - 1) / BLOCK;  // blocks holding outputs (the packed rows pad to a multiple of 4)
  using S = typename std::conditional<DEQUANT, Tile<F>, F>::type;
  for (int64_t c0 = u0; c0 < u1; c0 += UC) {
    const int64_t c1 = std::min(u1, c0 + UC);
    for (int64_t m0 = 0; m0 < M; m0 += MC) {
      const int64_t rows = std::min(MC, M - m0);
      const float* xm = x + m0 * ldx;
      const float* sm = xsum + m0 * G;
      for (int64_t u = c0; u < c1; ++u) {
        const int64_t block = u * TILE_BLOCKS, nb = std::min<int64_t>(TILE_BLOCKS, nbn - block), np = nb * PB;
        for (int64_t m = 0; m < rows; ++m)
          for (int i = 0; i < LDT; ++i) tot[m * LDT + i] = 0.0f;
        const int64_t kblocks = (G + KC - 1) / KC;  // as even as they go (18 groups: 6 + 6 + 6)
        for (int64_t j = 0; j < kblocks; ++j) {
          const int64_t g0 = G * j / kblocks;
          const int gn = (int)(G * (j + 1) / kblocks - g0);
          const int32_t* base[P];
          int lane[P];
          for (int p = 0; p < P; ++p) {
            const int64_t b = p / PB;
            base[p] = DEQUANT ? tile + b * KC * S::REC : packed + ((block + b) * G + g0) * F::REC;
            lane[p] = (p % PB) * W;
          }
          if constexpr (DEQUANT)
            for (int b = 0; b < nb; ++b)
              for (int g = 0; g < gn; ++g) {
                const int32_t* rec = packed + ((block + b) * G + g0 + g) * F::REC;
                float* t = reinterpret_cast<float*>(tile + (b * KC + g) * S::REC);
                for (int k = 0; k < GROUP; ++k)
                  for (int p = 0; p < PB; ++p) Vec::store(t + k * BLOCK + p * W, F::code(rec, p * W, k));
                const float* sz = reinterpret_cast<const float*>(rec + F::SCALE);
                for (int i = 0; i < (F::ZERO ? 2 : 1) * BLOCK; ++i) t[GROUP * BLOCK + i] = sz[i];
              }
          const float* xk = xm + g0 * x_step<F>();
          if (np == P && rows >= 2 * MB_TILE)
            for (int p = 0; p < P; p += TILE_P)
              tile_rows<S, TILE_P, MB_TILE>(base + p, lane + p, gn, xk, ldx, sm + g0, G, rows, tot + p * W, LDT);
          else  // the last unit, short of blocks, or few rows (passes of up to 6): one block at a time
            for (int p = 0; p < np; p += PB)
              tile_rows<S, PB, 6>(base + p, lane + p, gn, xk, ldx, sm + g0, G, rows, tot + p * W, LDT);
        }
        for (int64_t m = 0; m < rows; ++m)
          for (int p = 0; p < np; ++p)
            store_lanes(out + (m0 + m) * ldo, block * BLOCK + p * W, N, Vec::load(tot + m * LDT + p * W));
      }
    }
  }
}

// Work units of a linear over M rows and N outputs: DIRECT_P panels of the direct path (M <
// TILE_MIN), else TILE_BLOCKS blocks of the tile path. Never past the packed rows (a multiple of 64).
static inline int64_t linear_unit_count(int64_t M, int64_t N) {
  constexpr int W = Vec::W;
  if (M < TILE_MIN) return ((N + W - 1) / W + DIRECT_P - 1) / DIRECT_P;
  return ((N + BLOCK - 1) / BLOCK + TILE_BLOCKS - 1) / TILE_BLOCKS;  // the last may be short of blocks
}

// Units u0..u1 of y [M, N] (stride ldo) = x [M, G*32] (stride ldx, zero past K) times the packed
// weight; xsum [M, G] (int4 only). Each output element's order is the same whatever the units a call
// runs, so `linear` splits them over threads and the MoE op (moe.h) over (expert, unit) items.
template <class F>
static void linear_units(const int32_t* packed, int64_t G, const float* x, int64_t M, int64_t ldx, const float* xsum,
                         float* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1) {
  if (M < TILE_MIN) {
    for (int64_t u = u0; u < u1; ++u) direct_unit<F, DIRECT_P>(packed, G, u * DIRECT_P, x, M, ldx, xsum, out, ldo, N);
    return;
  }
  // M blocks of whole passes (a multiple of MB_TILE rows); chunks of at least one unit
  const int64_t MC = std::max<int64_t>(MB_TILE, X_BLOCK_BYTES / (G * GROUP * 4) / MB_TILE * MB_TILE);
  const int64_t UC = std::max<int64_t>(1, W_CHUNK_BYTES / (TILE_BLOCKS * G * F::REC * 4));
  std::vector<int32_t> tile(TILE_BLOCKS * KC * Tile<F>::REC + 16);
  std::vector<float> tot(std::min(MC, M) * TILE_BLOCKS * BLOCK + 16);
  tile_units<F>(packed, G, u0, u1, x, M, ldx, xsum, out, ldo, N, MC, UC, align64(tile.data()), align64(tot.data()));
}
