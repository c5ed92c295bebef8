// qlinear's w4a8 linear on AMX int8 tiles (qlinear_kernel.h runs it for the many-row products of a
// prefill; qlinear_dot_impl.h has the arithmetic). The same bits as the VNNI path, by construction:
// each output element is still, for each group g in order, tot = fma(float(isum_g), d_w * d_x, tot);
// tot = fma(m_w, s_x, tot), where isum_g (the exact integer dot product of the group's 32 weight codes
// and 32 activation codes) now comes out of one TDPBUSD per (16 outputs, 16 rows, group) instead of
// vpdpbusd lanes. Integers are exact whatever adds them, and the float steps are the same IEEE
// operations on the same values: a row's bits do not depend on the path, so the rows of a step may
// take either (tests/model/test_qlinear_dot.py compares them bit for bit).
//
// Tiles (transposed: outputs are C's rows, activation rows its columns, so the unsigned int4 codes are
// TDPBUSD's unsigned A operand): A = a block's 16 storage rows x the group's 32 codes widened to bytes
// (pack_w4a8 keeps them as nibbles: byte j = input j | input j + 16 << 4); B = the group's 32 int8
// activation codes of 16 rows in VNNI order (B[k / 4][4 t + k % 4] = x[t][k]: a 16 x 16 dword
// transpose of two groups at a time); C = int32 [16 outputs][16 rows], stored after each group and
// folded into 16 float accumulators (one per output, lanes over the rows) by the group's scales.
#include "qlinear_common.h"

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-int8,amx-bf16,avx2,fma,f16c")
namespace isa_amx {
#include "amx_tiles.h"

namespace {
constexpr int64_t W4_REC = 16 * 16 + 2 * 16 * 2, W4_SCALE = 16 * 16;  // pack_w4a8's record (bytes) and its scales
constexpr int SLOTS[8] = {0, 4, 1, 5, 2, 6, 3, 7};                        // kernels/qlinear.py W4A8_SLOTS

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
}  // namespace isa_amx
#pragma GCC pop_options
