// AMX tile configuration and helpers shared by the kernels that use tiles (qlinear_amx.cpp isa_amx,
// attention/mla_prefill_amx.h, mla_decode_amx.h, decode_ops/head_amx.h). Included inside a namespace compiled with amx-tile
// and avx512f; nothing here may include a header. Callers run it in each thread before its first tile instruction.
#pragma once

struct AmxTileConfig {  // ldtilecfg's 64-byte operand, palette 1
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// ldtilecfg with every byte of cfg written first: GCC 12 takes the intrinsic's operand for a read of
// its first bytes only and dropped the stores of rows / colsb in a leaf function (the tiles then
// stayed unconfigured and the first tile instruction faulted)
static inline void amx_load_config(AmxTileConfig& cfg) {
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

static inline void amx_configure() {  // tiles 0-7: 16 rows of 64 bytes each
  AmxTileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  amx_load_config(cfg);
}

// out[j][i] = in[i][j] for 16 x 16 32-bit words (rows `si` / `so` words apart): interleaves of 32
// and 64 bits within 128-bit lanes, then a 4 x 4 transpose of the lanes. The AMX kernels turn their
// rows x pairs blocks into pairs x rows (and back) with it.
static inline void transpose16(const uint32_t* in, int64_t si, uint32_t* out, int64_t so) {
  __m512i u[4][4];
  for (int g = 0; g < 4; ++g) {
    const __m512i r0 = _mm512_loadu_si512(in + (4 * g) * si), r1 = _mm512_loadu_si512(in + (4 * g + 1) * si);
    const __m512i r2 = _mm512_loadu_si512(in + (4 * g + 2) * si), r3 = _mm512_loadu_si512(in + (4 * g + 3) * si);
    const __m512i a = _mm512_unpacklo_epi32(r0, r1), b = _mm512_unpackhi_epi32(r0, r1);
    const __m512i c = _mm512_unpacklo_epi32(r2, r3), d = _mm512_unpackhi_epi32(r2, r3);
    // lane L of u[g][k]: column 4L + k, rows 4g .. 4g + 3
    u[g][0] = _mm512_unpacklo_epi64(a, c), u[g][1] = _mm512_unpackhi_epi64(a, c);
    u[g][2] = _mm512_unpacklo_epi64(b, d), u[g][3] = _mm512_unpackhi_epi64(b, d);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[0][k], u[1][k], 0x44), x1 = _mm512_shuffle_i32x4(u[0][k], u[1][k], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(u[2][k], u[3][k], 0x44), x3 = _mm512_shuffle_i32x4(u[2][k], u[3][k], 0xEE);
    _mm512_storeu_si512(out + k * so, _mm512_shuffle_i32x4(x0, x2, 0x88));
    _mm512_storeu_si512(out + (4 + k) * so, _mm512_shuffle_i32x4(x0, x2, 0xDD));
    _mm512_storeu_si512(out + (8 + k) * so, _mm512_shuffle_i32x4(x1, x3, 0x88));
    _mm512_storeu_si512(out + (12 + k) * so, _mm512_shuffle_i32x4(x1, x3, 0xDD));
  }
}

// The bf16 pair words of two 16-lane vectors: lane i's (a[i], b[i]), rounded to nearest even, as one
// row of a B tile whose pairs run across two keys / tokens (the AMX attention kernels' probabilities).
static inline __m512i pair_words(__m512 a, __m512 b) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

// A reduction over K values in steps of one tile depth (32 bf16): step s covers [off, off + 32) of
// each row, off = 32s, or K - 32 for a last step of K % 32 values, read inside the row (the other
// operand holds zeros for the values below 32s, counted in the step before), so every tile stays
// 16 x 64 bytes. K >= 32, even. (The AMX decode kernel's scores, head_matmul's products.)
static inline int amx_steps(int K) { return (K + 31) / 32; }
static inline int amx_step_offset(int s, int K) { return 32 * s + 32 <= K ? 32 * s : K - 32; }

// out [16][16 * nz] float32 (row stride ldo floats) = sum over `steps` of A(s) . B(s), for 16 rows
// and nz column blocks of 16: A(s) = a_of(s), 16 rows x 32 bf16 (lda bytes a row); B(s) = b_of(s)
// + 32 z for block z, 16 pairs x (16 columns x 2) (ldb bytes a row). Four blocks at a time in C
// tiles 0-3, summed over every step and stored once (A 4, B 5 / 6 alternating). Each output is one
// tile lane's sum in the instruction's order over the steps. Tiles as amx_configure sets them.
template <class AOf, class BOf>
static inline void amx_sum_blocks(int steps, int nz, AOf a_of, int lda, BOf b_of, int ldb, float* out, int64_t ldo) {
  for (int z0 = 0; z0 < nz; z0 += 4) {
    const int cnt = nz - z0 < 4 ? nz - z0 : 4;
    _tile_zero(0);
    if (cnt > 1) _tile_zero(1);
    if (cnt > 2) _tile_zero(2);
    if (cnt > 3) _tile_zero(3);
    for (int s = 0; s < steps; ++s) {
      const uint16_t* b = b_of(s) + 32 * z0;
      _tile_loadd(4, a_of(s), lda);
      _tile_loadd(5, b, ldb);
      _tile_dpbf16ps(0, 4, 5);
      if (cnt > 1) {
        _tile_loadd(6, b + 32, ldb);
        _tile_dpbf16ps(1, 4, 6);
      }
      if (cnt > 2) {
        _tile_loadd(5, b + 64, ldb);
        _tile_dpbf16ps(2, 4, 5);
      }
      if (cnt > 3) {
        _tile_loadd(6, b + 96, ldb);
        _tile_dpbf16ps(3, 4, 6);
      }
    }
    float* o = out + 16 * z0;
    const int64_t sto = ldo * 4;
    _tile_stored(0, o, sto);
    if (cnt > 1) _tile_stored(1, o + 16, sto);
    if (cnt > 2) _tile_stored(2, o + 32, sto);
    if (cnt > 3) _tile_stored(3, o + 48, sto);
  }
}
