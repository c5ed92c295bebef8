// Weight-only quantized linear y = x · Wᵀ, one instruction set. Included once per ISA by qlinear.cpp
// inside `namespace <isa>` under `#pragma GCC target(...)`, after that namespace's `struct Vec`
// (W float lanes: zero, load, store, set1, fma, nibble, byte). Nothing here may include a header.
//
// Packed weights (built by model/qlinear.py): output rows in blocks of 16, one record per
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
// the codes come straight from the packed record ("direct") or from a block dequantized once
// into a float tile and reused by all rows ("tile", for M >= TILE_MIN): batch-invariant by construction.

constexpr int BLOCK = 16;  // output rows per packed block
constexpr int GROUP = 32;  // inputs per group (quant.py INT4_GROUP)
constexpr int MB_TILE = 6; // activation rows per tile-kernel pass

constexpr int AHEAD = 4;   // groups ahead to prefetch the packed records (they stream from memory)

struct Int4 {
  static constexpr bool STREAM = true;
  static constexpr int REC = 4 * BLOCK + 2 * BLOCK;  // words per record
  static constexpr int SCALE = 4 * BLOCK;
  static constexpr bool ZERO = true;
  static inline Vec::T code(const int32_t* rec, int lane, int k) { return Vec::nibble(rec + (k >> 3) * BLOCK + lane, k & 7); }
};

struct Int8 {
  static constexpr bool STREAM = true;
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
  static constexpr bool STREAM = true;
  static constexpr int REC = GROUP * BLOCK + BLOCK;
  static constexpr int SCALE = GROUP * BLOCK;
  static constexpr bool ZERO = false;
  static inline Vec::T code(const int32_t* rec, int lane, int k) {
    return Vec::load(reinterpret_cast<const float*>(rec) + k * BLOCK + lane);
  }
};

// A block dequantized to float codes (q * 16^t for int4, q for int8): [32 inputs][16 rows] floats, then scale and zero.
template <class F>
struct Tile {
  static constexpr bool STREAM = false;
  static constexpr int REC = GROUP * BLOCK + 2 * BLOCK;
  static constexpr int SCALE = GROUP * BLOCK;
  static constexpr bool ZERO = F::ZERO;
  static inline Vec::T code(const int32_t* rec, int lane, int k) {
    return Vec::load(reinterpret_cast<const float*>(rec) + k * BLOCK + lane);
  }
};

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

// P panels (W rows each: panel i is packed panel first + i, output columns col0 + i * W ...) times MB
// activation rows, over all G groups. x [MB rows, stride ldx] float32 (zero past K), xsum [MB rows][G];
// out rows stride ldo, only columns < N written.
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
    for (int p = 0; p < P; ++p)
      for (int m = 0; m < MB; ++m) acc[p][m] = Vec::zero();
    const float* xg = x + g * GROUP;
    if constexpr (F::STREAM)
      if (g + AHEAD < G)
        for (int p = 0; p < P; ++p)
          if (lane[p] == 0)
            for (int line = 0; line < F::REC * 4; line += 64)
              __builtin_prefetch(reinterpret_cast<const char*>(base[p] + (g + AHEAD) * F::REC) + line);
#pragma GCC unroll 32
    for (int k = 0; k < GROUP; ++k) {
      typename Vec::T q[P];
      for (int p = 0; p < P; ++p) q[p] = F::code(base[p] + g * F::REC, lane[p], k);
      for (int m = 0; m < MB; ++m) {
        const typename Vec::T xv = Vec::set1(xg[m * ldx + k]);
        for (int p = 0; p < P; ++p) acc[p][m] = Vec::fma(q[p], xv, acc[p][m]);
      }
    }
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

// M < TILE_MIN: rows in passes of MB <= 3, codes read straight from the packed records; units of
// DIRECT_P panels (the packed rows are a multiple of 64, so a unit never runs past them).
template <class F, int P>
static void direct_unit(const int32_t* packed, int64_t G, int64_t first, const float* x, int64_t M, int64_t ldx,
                        const float* xsum, float* out, int64_t ldo, int64_t N) {
  constexpr int H = P / 2, W = Vec::W;
  int64_t m = 0;
  for (; m + 3 <= M; m += 3)
    for (int h = 0; h < 2; ++h)
      panels<F, H, 3>(packed, G, first + h * H, (first + h * H) * W, x + m * ldx, ldx, xsum + m * G, out + m * ldo, ldo, N);
  if (M - m == 2)
    for (int h = 0; h < 2; ++h)
      panels<F, H, 2>(packed, G, first + h * H, (first + h * H) * W, x + m * ldx, ldx, xsum + m * G, out + m * ldo, ldo, N);
  else if (M - m == 1)
    panels<F, P, 1>(packed, G, first, first * W, x + m * ldx, ldx, xsum + m * G, out + m * ldo, ldo, N);
}

// M >= TILE_MIN: dequantize TILE_BLOCKS blocks once into `tile` (G records of Tile<F>, TILE_BLOCKS
// blocks side by side), then all rows in passes of MB_TILE.
template <class F>
static void tile_unit(const int32_t* packed, int64_t G, int64_t block, const float* x, int64_t M, int64_t ldx,
                      const float* xsum, float* out, int64_t ldo, int64_t N, int32_t* tile) {
  constexpr int W = Vec::W, PB = BLOCK / W, P = TILE_BLOCKS * PB;
  for (int b = 0; b < TILE_BLOCKS; ++b) {
    const int32_t* src = packed + (block + b) * G * F::REC;
    int32_t* dst = tile + b * G * Tile<F>::REC;
    for (int64_t g = 0; g < G; ++g) {
      const int32_t* rec = src + g * F::REC;
      float* t = reinterpret_cast<float*>(dst + g * Tile<F>::REC);
      for (int k = 0; k < GROUP; ++k)
        for (int p = 0; p < PB; ++p) Vec::store(t + k * BLOCK + p * W, F::code(rec, p * W, k));
      const float* sz = reinterpret_cast<const float*>(rec + F::SCALE);
      for (int i = 0; i < (F::ZERO ? 2 : 1) * BLOCK; ++i) t[GROUP * BLOCK + i] = sz[i];
    }
  }
  const int32_t* t = tile;
  const int64_t col0 = block * BLOCK;
  // rows in passes of 3..MB_TILE, as even as they go (8 rows: 4 + 4, not 6 + 2)
  const int64_t passes = (M + MB_TILE - 1) / MB_TILE;
  for (int64_t i = 0, m = 0; i < passes; ++i) {
    const int64_t rows = M / passes + (i < M % passes);
    const float* xm = x + m * ldx;
    const float* sm = xsum + m * G;
    float* om = out + m * ldo;
    switch (rows) {
      case 6: panels<Tile<F>, P, 6>(t, G, 0, col0, xm, ldx, sm, om, ldo, N); break;
      case 5: panels<Tile<F>, P, 5>(t, G, 0, col0, xm, ldx, sm, om, ldo, N); break;
      case 4: panels<Tile<F>, P, 4>(t, G, 0, col0, xm, ldx, sm, om, ldo, N); break;
      case 3: panels<Tile<F>, P, 3>(t, G, 0, col0, xm, ldx, sm, om, ldo, N); break;
      case 2: panels<Tile<F>, P, 2>(t, G, 0, col0, xm, ldx, sm, om, ldo, N); break;
      default: panels<Tile<F>, P, 1>(t, G, 0, col0, xm, ldx, sm, om, ldo, N); break;
    }
    m += rows;
  }
}

// y [M, N] (stride ldo) = x [M, G*32] (stride ldx, zero past K) times the packed weight (NB blocks);
// xsum [M, G] (int4 only). Work items split the output rows over at::parallel_for's threads.
template <class F>
static void linear(const int32_t* packed, int64_t NB, int64_t G, const float* x, int64_t M, int64_t ldx,
                   const float* xsum, float* out, int64_t ldo, int64_t N) {
  constexpr int W = Vec::W;
  (void)NB;
  if (M < TILE_MIN) {
    const int64_t units = ((N + W - 1) / W + DIRECT_P - 1) / DIRECT_P;  // never past the packed rows (a multiple of 64)
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u)
        direct_unit<F, DIRECT_P>(packed, G, u * DIRECT_P, x, M, ldx, xsum, out, ldo, N);
    });
    return;
  }
  const int64_t units = ((N + BLOCK - 1) / BLOCK + TILE_BLOCKS - 1) / TILE_BLOCKS;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> tile(TILE_BLOCKS * G * Tile<F>::REC + 16);
    int32_t* aligned = reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(tile.data()) + 63) & ~uintptr_t(63));
    for (int64_t u = begin; u < end; ++u) tile_unit<F>(packed, G, u * TILE_BLOCKS, x, M, ldx, xsum, out, ldo, N, aligned);
  });
}
