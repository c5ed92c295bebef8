// qlinear's w4a8 linears on AMX int8 tiles (qlinear_kernel.h runs them for the many-row products of a
// prefill; qlinear_dot_impl.h has the arithmetic). The same bits as the VNNI path, by construction: each
// output element is still, for each group g in order, tot = fma(float(isum_g), d_w * d_x, tot);
// tot = fma(m_w, s_x, tot), where isum_g (the exact integer dot product of the group's weight codes and
// activation codes) now comes out of TDPBUSD per (16 outputs, 16 rows, group) instead of vpdpbusd lanes.
// Integers are exact whatever adds them, and the float steps are the same IEEE operations on the same
// values: a row's bits do not depend on the path, so the rows of a step may take either
// (tests/model/test_qlinear_dot.py compares them bit for bit).
//
// Tiles (transposed: outputs are C's rows, activation rows its columns, so the unsigned int4 codes are
// TDPBUSD's unsigned A operand): A = a block's 16 storage rows x a group's codes widened to bytes
// (pack_w4a8 keeps them as nibbles, sub-blocks of 32: byte j = input j | input j + 16 << 4); B = int8
// activation codes of 16 rows in VNNI order (B[k / 4][4 t + k % 4] = x[t][k]: a 16 x 16 dword transpose);
// C = int32 [16 outputs][16 rows], stored after each group and folded into 16 float accumulators (one per
// output, lanes over the rows) by the group's scales. Those stores and folds, not the products, bound the
// loop (docs/results/amx-xeon/w4a8-limits): w4a8 (kind 104, groups of 32) stores a C tile per 8K
// multiply-adds; w4a8_g128 (kind 114) sums two 64-deep products into each C tile first, one store and one
// fold per 32K, and shares each activation tile between a unit's two output blocks.
#include "qlinear_common.h"

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-int8,amx-bf16,avx2,fma,f16c")
namespace isa_amx {
#include "amx_tiles.h"

namespace {
constexpr int64_t W4_REC = 16 * 16 + 2 * 16 * 2, W4_SCALE = 16 * 16;  // pack_w4a8's record on groups of 32 (bytes) and its scales
constexpr int64_t W4G_SUBS = 4, W4G_SUB = 16 * 16, W4G_SCALE = W4G_SUBS * W4G_SUB, W4G_REC = W4G_SCALE + 2 * 16 * 2;  // on 128
constexpr int64_t HALF = 16 * 64;  // bytes of one 64-deep A or B tile of 16 rows (w4a8_g128)
constexpr int64_t CHUNK = 8;       // w4a8_g128: groups summed before they are folded (two blocks' C tiles: 16 KiB, in L1)
constexpr int SLOTS[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // kernels/qlinear.py W4A8_SLOTS

// --- w4a8, groups of 32: one 32-deep product per (block, row tile, group)
void configure_int8() {  // 0: C [16 x 64 B]; 1: A [16 x 32 B]; 2: B [8 x 64 B]
  AmxTileConfig cfg{};
  cfg.palette = 1;
  cfg.rows[0] = 16, cfg.colsb[0] = 64;
  cfg.rows[1] = 16, cfg.colsb[1] = 32;
  cfg.rows[2] = 8, cfg.colsb[2] = 64;
  amx_load_config(cfg);
}

// One block's G records -> A tiles [G][16 storage rows][32 bytes] (row p's codes in input order).
void widen_block(const uint8_t* rec0, int64_t G, uint8_t* a) {
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* rec = rec0 + g * W4_REC;
    for (int q = 0; q < 4; ++q) {  // 64 bytes: storage rows 4q .. 4q + 3, 16 bytes each
      const __m512i v = _mm512_loadu_si512(rec + 64 * q);
      const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      _mm512_storeu_si512(a + g * 512 + 128 * q, _mm512_permutex2var_epi64(lo, first, hi));
      _mm512_storeu_si512(a + g * 512 + 128 * q + 64, _mm512_permutex2var_epi64(lo, second, hi));
    }
  }
}

// Rows t0 .. t0 + 16 of xq (fewer: zero rows) -> B tiles [G][8][64 B]; their d_x, s_x -> [G][16] each.
void pack_rows(const int8_t* xq, int64_t ldq, int64_t rows, int64_t G, const float* xd, const float* xs, uint8_t* b,
               float* dx, float* sx) {
  uint32_t in[16][16], out[16][16];
  for (int64_t g = 0; g < G; g += 2) {
    const int64_t bytes = g + 1 < G ? 64 : 32;
    for (int t = 0; t < 16; ++t) {
      std::memset(in[t], 0, sizeof in[t]);
      if (t < rows) std::memcpy(in[t], xq + t * ldq + g * 32, bytes);
    }
    transpose16(&in[0][0], 16, &out[0][0], 16);  // out[k][t]: dword k of row t (k < 8: group g; else g + 1)
    std::memcpy(b + g * 512, out[0], 512);
    if (g + 1 < G) std::memcpy(b + (g + 1) * 512, out[8], 512);
  }
  for (int64_t g = 0; g < G; ++g)
    for (int t = 0; t < 16; ++t) dx[g * 16 + t] = t < rows ? xd[t * G + g] : 0.0f, sx[g * 16 + t] = t < rows ? xs[t * G + g] : 0.0f;
}

// --- w4a8_g128, groups of 128: two 64-deep products per group, two blocks at a time
// One block's G records -> A tiles [G][2][16 storage rows][64 bytes] (row p's codes in input order).
void widen_block_g(const uint8_t* rec0, int64_t G, uint8_t* a) {
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t g = 0; g < G; ++g)
    for (int s = 0; s < W4G_SUBS; ++s) {
      const uint8_t* sub = rec0 + g * W4G_REC + s * W4G_SUB;
      uint8_t* dst = a + (2 * g + s / 2) * HALF + 32 * (s % 2);
      for (int q = 0; q < 4; ++q) {  // 64 bytes: storage rows 4q .. 4q + 3, 16 bytes each
        const __m512i v = _mm512_loadu_si512(sub + 64 * q);
        const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        const __m512i r01 = _mm512_permutex2var_epi64(lo, first, hi), r23 = _mm512_permutex2var_epi64(lo, second, hi);
        uint8_t* row = dst + 4 * q * 64;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), _mm512_castsi512_si256(r01));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 64), _mm512_extracti64x4_epi64(r01, 1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 128), _mm512_castsi512_si256(r23));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 192), _mm512_extracti64x4_epi64(r23, 1));
      }
    }
}

// Rows t0 .. t0 + 16 of xq (fewer: zero rows) -> B tiles [G][2][16][64 B]; their d_x, s_x -> [G][16] each.
void pack_rows_g(const int8_t* xq, int64_t ldq, int64_t rows, int64_t G, const float* xd, const float* xs, uint8_t* b,
               float* dx, float* sx) {
  uint32_t in[16][16];
  for (int64_t h = 0; h < 2 * G; ++h) {  // 64 inputs at a time
    for (int t = 0; t < 16; ++t) {
      if (t < rows) std::memcpy(in[t], xq + t * ldq + 64 * h, 64);
      else std::memset(in[t], 0, 64);
    }
    transpose16(&in[0][0], 16, reinterpret_cast<uint32_t*>(b + h * HALF), 16);  // dword k of row t -> B[k][t]
  }
  for (int64_t g = 0; g < G; ++g)
    for (int t = 0; t < 16; ++t) dx[g * 16 + t] = t < rows ? xd[t * G + g] : 0.0f, sx[g * 16 + t] = t < rows ? xs[t * G + g] : 0.0f;
}

// c[b][g - g0] = the integer sums of groups g0 .. g1 for blocks b = 0, 1 (A tiles a0, a1; B tiles b: 16
// outputs x 16 rows each): a group's two 64-deep products per block summed in its C tile, stored once.
// The two blocks share each B tile load (the activations, read from L2 once per block pair).
void group_sums_g(const uint8_t* a0, const uint8_t* a1, const uint8_t* b, int64_t g0, int64_t g1, int32_t (*c)[CHUNK][16][16]) {
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t off = 2 * g * HALF;
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(6, b + off, 64);
    _tile_loadd(2, a0 + off, 64);
    _tile_loadd(3, a1 + off, 64);
    _tile_dpbusd(0, 2, 6);
    _tile_dpbusd(1, 3, 6);
    _tile_loadd(7, b + off + HALF, 64);
    _tile_loadd(4, a0 + off + HALF, 64);
    _tile_loadd(5, a1 + off + HALF, 64);
    _tile_dpbusd(0, 4, 7);
    _tile_dpbusd(1, 5, 7);
    _tile_stored(0, c[0][g - g0], 64);
    _tile_stored(1, c[1][g - g0], 64);
  }
}
}  // namespace

// Units u0..u1 (qlinear_dot_impl.h dot_unit_count: 2 blocks of 16 outputs each) of y [M, N] float32
// (stride ldo) from xq [M, G * 32] (stride ldq) and d_x, s_x [M, G]: dot_units<W4>'s contract and bits.
void dot_w4_units(const uint8_t* packed, int64_t G, const int8_t* xq, int64_t M, int64_t ldq, const float* xd,
                  const float* xs, const int32_t*, float* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1) {
  const int64_t tiles = (M + 15) / 16;
  std::vector<uint8_t> a(G * 512), b(tiles * G * 512);
  std::vector<float> dx(tiles * G * 16), sx(tiles * G * 16);
  for (int64_t i = 0; i < tiles; ++i)
    pack_rows(xq + i * 16 * ldq, ldq, std::min<int64_t>(16, M - 16 * i), G, xd + i * 16 * G, xs + i * 16 * G,
              b.data() + i * G * 512, dx.data() + i * G * 16, sx.data() + i * G * 16);
  alignas(64) int32_t c[16][16];
  alignas(64) float acc[16][16], rows_out[16][16];
  int32_t position[16];  // lane r of an output row vector: storage row of output r
  for (int p = 0; p < 16; ++p) position[8 * (p / 8) + SLOTS[p % 8]] = p;
  const __m512i to_rows = _mm512_loadu_si512(position);
  configure_int8();
  std::vector<float> dw(G * 16), mw(G * 16);  // a block's scales and mins by group, in output row order
  for (int64_t block = 2 * u0; block < 2 * u1 && block * 16 < N; ++block) {
    const uint8_t* rec0 = packed + block * G * W4_REC;
    widen_block(rec0, G, a.data());
    for (int64_t g = 0; g < G; ++g) {
      const uint16_t* h = halves(rec0 + g * W4_REC, (int)W4_SCALE);
      _mm512_storeu_ps(dw.data() + g * 16, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h))));
      _mm512_storeu_ps(mw.data() + g * 16, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 16))));
    }
    for (int64_t i = 0; i < tiles; ++i) {
      __m512 tot[16];
      for (int p = 0; p < 16; ++p) tot[p] = _mm512_setzero_ps();
      for (int64_t g = 0; g < G; ++g) {
        _tile_zero(0);
        _tile_loadd(1, a.data() + g * 512, 32);
        _tile_loadd(2, b.data() + (i * G + g) * 512, 64);
        _tile_dpbusd(0, 1, 2);
        _tile_stored(0, c, 64);
        const __m512 d_x = _mm512_loadu_ps(dx.data() + (i * G + g) * 16), s_x = _mm512_loadu_ps(sx.data() + (i * G + g) * 16);
        const float* d_w = dw.data() + g * 16;
        const float* m_w = mw.data() + g * 16;
#pragma GCC unroll 16
        for (int p = 0; p < 16; ++p) {
          const int r = 8 * (p / 8) + SLOTS[p % 8];  // storage row p holds output row r
          const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(c[p]));
          tot[p] = _mm512_fmadd_ps(isum, _mm512_mul_ps(_mm512_set1_ps(d_w[r]), d_x), tot[p]);
          tot[p] = _mm512_fmadd_ps(_mm512_set1_ps(m_w[r]), s_x, tot[p]);
        }
      }
      // tot[p] lane t -> rows_out[t][p] -> output row order, the block's columns of each row
      for (int p = 0; p < 16; ++p) _mm512_store_ps(acc[p], tot[p]);
      transpose16(reinterpret_cast<const uint32_t*>(&acc[0][0]), 16, reinterpret_cast<uint32_t*>(&rows_out[0][0]), 16);
      const int64_t cols = std::min<int64_t>(16, N - block * 16);
      for (int64_t t = 0; t < std::min<int64_t>(16, M - 16 * i); ++t) {
        const __m512 v = _mm512_permutexvar_ps(to_rows, _mm512_load_ps(rows_out[t]));
        _mm512_mask_storeu_ps(out + (16 * i + t) * ldo + block * 16, (__mmask16)((1u << cols) - 1), v);
      }
    }
  }
  _tile_release();
}

// Units u0..u1 (qlinear_dot_impl.h dot_unit_count: 2 blocks of 16 outputs each) of w4a8_g128 (kind 114) of y [M, N] float32
// (stride ldo) from xq [M, G * 128] (stride ldq) and d_x, s_x [M, G]: dot_units<W4G>'s contract and bits.
void dot_w4g_units(const uint8_t* packed, int64_t G, const int8_t* xq, int64_t M, int64_t ldq, const float* xd,
                  const float* xs, const int32_t*, float* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1) {
  const int64_t tiles = (M + 15) / 16;
  std::vector<uint8_t> b(tiles * 2 * G * HALF);
  std::vector<float> dx(tiles * G * 16), sx(tiles * G * 16);
  for (int64_t i = 0; i < tiles; ++i)
    pack_rows_g(xq + i * 16 * ldq, ldq, std::min<int64_t>(16, M - 16 * i), G, xd + i * 16 * G, xs + i * 16 * G,
              b.data() + i * 2 * G * HALF, dx.data() + i * G * 16, sx.data() + i * G * 16);
  alignas(64) int32_t c[2][CHUNK][16][16];
  alignas(64) float acc[16][16], rows_out[16][16];
  int32_t position[16];  // lane r of an output row vector: storage row of output r
  for (int p = 0; p < 16; ++p) position[8 * (p / 8) + SLOTS[p % 8]] = p;
  const __m512i to_rows = _mm512_loadu_si512(position);
  amx_configure();
  // a unit's two blocks (pack_w4a8 pads the rows to a multiple of 64: both are always there), their
  // codes widened and their scales and mins by group, in output row order
  std::vector<uint8_t> a(2 * 2 * G * HALF);
  std::vector<float> dw(2 * G * 16), mw(2 * G * 16);
  for (int64_t u = u0; u < u1 && 32 * u < N; ++u) {
    for (int k = 0; k < 2; ++k) {
      const uint8_t* rec0 = packed + (2 * u + k) * G * W4G_REC;
      widen_block_g(rec0, G, a.data() + k * 2 * G * HALF);
      for (int64_t g = 0; g < G; ++g) {
        const uint16_t* h = halves(rec0 + g * W4G_REC, (int)W4G_SCALE);
        _mm512_storeu_ps(dw.data() + (k * G + g) * 16, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h))));
        _mm512_storeu_ps(mw.data() + (k * G + g) * 16, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 16))));
      }
    }
    for (int64_t i = 0; i < tiles; ++i) {
      __m512 tot[2][16];
      for (int k = 0; k < 2; ++k)
        for (int p = 0; p < 16; ++p) tot[k][p] = _mm512_setzero_ps();
      for (int64_t g0 = 0; g0 < G; g0 += CHUNK) {
        const int64_t g1 = std::min(G, g0 + CHUNK);
        group_sums_g(a.data(), a.data() + 2 * G * HALF, b.data() + i * 2 * G * HALF, g0, g1, c);
        for (int k = 0; k < 2; ++k)
          for (int64_t g = g0; g < g1; ++g) {
            const __m512 d_x = _mm512_loadu_ps(dx.data() + (i * G + g) * 16), s_x = _mm512_loadu_ps(sx.data() + (i * G + g) * 16);
            const float* d_w = dw.data() + (k * G + g) * 16;
            const float* m_w = mw.data() + (k * G + g) * 16;
#pragma GCC unroll 16
            for (int p = 0; p < 16; ++p) {
              const int r = 8 * (p / 8) + SLOTS[p % 8];  // storage row p holds output row r
              const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(c[k][g - g0][p]));
              tot[k][p] = _mm512_fmadd_ps(isum, _mm512_mul_ps(_mm512_set1_ps(d_w[r]), d_x), tot[k][p]);
              tot[k][p] = _mm512_fmadd_ps(_mm512_set1_ps(m_w[r]), s_x, tot[k][p]);
            }
          }
      }
      for (int k = 0; k < 2; ++k) {  // tot[k][p] lane t -> rows_out[t][p] -> output row order, the block's columns of each row
        const int64_t col0 = (2 * u + k) * 16, cols = std::min<int64_t>(16, N - col0);
        if (cols <= 0) break;
        for (int p = 0; p < 16; ++p) _mm512_store_ps(acc[p], tot[k][p]);
        transpose16(reinterpret_cast<const uint32_t*>(&acc[0][0]), 16, reinterpret_cast<uint32_t*>(&rows_out[0][0]), 16);
        for (int64_t t = 0; t < std::min<int64_t>(16, M - 16 * i); ++t) {
          const __m512 v = _mm512_permutexvar_ps(to_rows, _mm512_load_ps(rows_out[t]));
          _mm512_mask_storeu_ps(out + (16 * i + t) * ldo + col0, (__mmask16)((1u << cols) - 1), v);
        }
      }
    }
  }
  _tile_release();
}
}  // namespace isa_amx
#pragma GCC pop_options
