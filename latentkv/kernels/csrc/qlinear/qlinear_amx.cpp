// qlinear's AMX kernel (qlinear.cpp has the entries and the contract), handed to qlinear_kernel.h
// through qlinear_paths.h (isa_amx::units).
#include "qlinear_common.h"

// isa_avx512's record layout and e^x, which the AMX kernel shares (its loops are qlinear_avx512.cpp's)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace isa_avx512 {
#include "qlinear_vec_avx512.h"
#include "qlinear_impl.h"
#include "exp_poly.h"  // common/: e^x (SwiGLU's)
}  // namespace isa_avx512
#pragma GCC pop_options

// AMX: bf16 weights times bf16 activations on the tile unit. A pack_bf16 record's [16 pairs][16 rows]
// words are one B tile of TDPBF16PS as they lie (64-byte rows), and a bf16 row's 32 inputs of a group
// one A tile row, so the kernel reads both without repacking. Each output element accumulates in its
// C tile group after group (one TDPBF16PS per group: 16 pairs in the unit's own fixed order), rows
// are independent lanes of the unit and always padded to whole 16-row tiles, and threads split the
// output columns: a row's bits are the same whatever M, its place in a tile or the threads, so the
// decode rows (M = 1) and a prompt's rows run one product. Not the avx512_bf16 path's bits (its own
// order): a process serves one ISA, and the self-check holds it to the scalar path's rounding.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
namespace isa_amx {
#include "amx_tiles.h"
// pack_bf16's record and the padded-row helper: qlinear_impl.h's, as the avx512 namespace has them
using isa_avx512::BLOCK, isa_avx512::GROUP, isa_avx512::align64;
constexpr int REC = isa_avx512::BF16::REC;
constexpr int64_t X_BLOCK_BYTES = 1 << 19;  // activation rows per M chunk: about this many bytes (of 2 MB L2: 256 KB-512 KB measured best)
constexpr int64_t KC = 8;  // groups per k block
// A decode step's rows (one pass of at most 32) read each weight once, from memory: the two blocks'
// records are prefetched this many bytes ahead as they stream (the hardware prefetcher alone left the
// 32-sequence step's linears ~2 ms slower at 4-8 KB; 16 KB gained half that).
constexpr int64_t STREAM_AHEAD = 4096;

// Tiles (amx_configure): 0-3 C (rows 16·i, columns 16·j at tile 2i + j), 4-5 A (two 16-row
// blocks), 6-7 B (two 16-column blocks).

// C tiles for two 16-row tiles (a0, and a1 when TWO: pair words, rows stride lda words, zeros past
// K) times blocks b0, b1 over groups g0 .. g1: started from zero (first k block) or from y (their
// running totals, float32: exact), stored back to y [32 rows, ldy]. Loads interleaved with the products that need them.
// STREAM: the weights are read once (a decode step's one pass): prefetched STREAM_AHEAD bytes ahead.
template <bool TWO, bool STREAM>
static inline void tile_pair(const int32_t* packed, int64_t G, int64_t b0, int64_t b1, int64_t g0, int64_t g1,
                             const int32_t* a0, int64_t lda0, const int32_t* a1, int64_t lda1, float* y, int64_t ldy) {
  const int64_t sy = ldy * 4;
  if (g0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (TWO) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, y, sy);
    _tile_loadd(1, y + 16, sy);
    if constexpr (TWO) {
      _tile_loadd(2, y + 16 * ldy, sy);
      _tile_loadd(3, y + 16 * ldy + 16, sy);
    }
  }
  const int32_t* w0 = packed + b0 * G * REC;
  const int32_t* w1 = packed + b1 * G * REC;
  for (int64_t g = g0; g < g1; ++g) {
    if constexpr (STREAM) {
      const char* p0 = reinterpret_cast<const char*>(w0 + g * REC) + STREAM_AHEAD;
      const char* p1 = reinterpret_cast<const char*>(w1 + g * REC) + STREAM_AHEAD;
      for (int o = 0; o < REC * 4; o += 64) {  // as volatile asm: GCC drops prefetch builtins it sees no use for
        asm volatile("prefetcht1 %0" : : "m"(*(p0 + o)));
        asm volatile("prefetcht1 %0" : : "m"(*(p1 + o)));
      }
    }
    _tile_loadd(4, a0 + g * 16, lda0 * 4);
    _tile_loadd(6, w0 + g * REC, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, w1 + g * REC, 64);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (TWO) {
      _tile_loadd(5, a1 + g * 16, lda1 * 4);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, y, sy);
  _tile_stored(1, y + 16, sy);
  if constexpr (TWO) {
    _tile_stored(2, y + 16 * ldy, sy);
    _tile_stored(3, y + 16 * ldy + 16, sy);
  }
}

// SwiGLU on 32 rows of a unit's sums c [32][32] (gate in columns 0-15, up in 16-31) -> out rows
// [16] bf16, one vector a row: both rounded to bf16 as the linear's output is (vcvtneps2bf16), then
// silu_mul_rows' arithmetic (common/swiglu_rows.h: exp_poly, one division, the integer rounding
// between the ops), so the bits equal the linear's bf16 output through decode_ops' silu_mul (tested;
// the scalar-shaped loop over 16 values a row took ~8% of a 2,048-token prefill step).
static inline __m512 bf16_rounded(__m512 v) {  // as the linear rounds its output
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}
static inline __m512i bf16_bits(__m512 v) {  // swiglu_rows.h float_to_bf16_bits on 16 lanes
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
}
static inline void swiglu_rows_out(const float* c, int64_t rows, uint16_t* out, int64_t ldo) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const __m512 g = bf16_rounded(_mm512_load_ps(c + i * 32)), u = bf16_rounded(_mm512_load_ps(c + i * 32 + 16));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, isa_avx512::exp_poly(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    const __m512 act = _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(silu), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * ldo), _mm512_cvtepi32_epi16(bf16_bits(_mm512_mul_ps(act, u))));
  }
}

// Units u0..u1 of out [M, N] bf16 (stride ldo) = x [M, G*16 pair words] times the packed bf16 weight: rows below
// M16 (whole 16-row tiles) read from x (stride ldx words), the others from tail [16, G*16] (stride
// ldt, zero rows past M). Any split of the units gives the same bits (qlinear.cpp's `linear` splits
// them over at::parallel_for's threads, moe.h over (expert, unit) items). Blocked so that the
// operands of the tile products come from near caches: the rows in chunks of MC (their activations
// stay in L2); per pair of blocks, K in blocks of KC groups whose weights (2 x KC KB) stay in L1
// across the chunk's rows, the chunk's running totals (MC x 32 floats) in L2 between k blocks; each
// 32 rows rounded to bf16 once (nearest even, as torch's .to(bfloat16)) as soon as their last k block
// is stored, while in L1, one 64-byte line per row (a separate pass over the chunk was ~a third of
// the kernel's time at M = 2,048).
template <bool SWIGLU = false>
static void amx_units(const int32_t* packed, int64_t G, const int32_t* x, int64_t M, int64_t ldx, int64_t M16,
                      const int32_t* tail, int64_t ldt, uint16_t* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1) {
  const int64_t Mp = (M + 15) / 16 * 16;
  const int64_t MC = std::max<int64_t>(32, X_BLOCK_BYTES / (G * GROUP * 2) / 32 * 32);
  const auto rows = [&](int64_t m) { return m < M16 ? x + m * ldx : tail + (m - M16) * ldt; };
  const auto stride = [&](int64_t m) { return m < M16 ? ldx : ldt; };
  std::vector<float> buffer(std::min(MC, Mp) * 32 + 16);
  float* c = align64(buffer.data());
  amx_configure();
  for (int64_t m0 = 0; m0 < Mp; m0 += MC) {
    const int64_t m1 = std::min(Mp, m0 + MC);
    // one pass of 32 rows (decode steps) reuses no weights across k blocks: all of K at once, the C
    // tiles never stored and reloaded between blocks (the same sums in the same order: the same bits)
    const int64_t kc = m1 - m0 <= 32 ? G : KC;
    for (int64_t u = u0; u < u1 && u * (SWIGLU ? 16 : 32) < N; ++u) {
      const int64_t n = u * (SWIGLU ? 16 : 32), cols = std::min<int64_t>(32, N - n);
      const int64_t b0 = SWIGLU ? u : 2 * u, b1 = SWIGLU ? u + N / 16 : 2 * u + 1;
      for (int64_t g0 = 0; g0 < G; g0 += kc)
        for (int64_t m = m0; m < m1; m += 32) {
          const int64_t g1 = std::min(G, g0 + kc);
          float* cm = c + (m - m0) * 32;
          const bool stream = m1 - m0 <= 32;  // one pass: all of K at once, each weight read once
          if (m + 16 < Mp && stream)
            tile_pair<true, true>(packed, G, b0, b1, g0, g1, rows(m), stride(m), rows(m + 16), stride(m + 16), cm, 32);
          else if (m + 16 < Mp)
            tile_pair<true, false>(packed, G, b0, b1, g0, g1, rows(m), stride(m), rows(m + 16), stride(m + 16), cm, 32);
          else if (stream)
            tile_pair<false, true>(packed, G, b0, b1, g0, g1, rows(m), stride(m), nullptr, 0, cm, 32);
          else
            tile_pair<false, false>(packed, G, b0, b1, g0, g1, rows(m), stride(m), nullptr, 0, cm, 32);
          if (g1 < G) continue;
          if constexpr (SWIGLU) {
            swiglu_rows_out(cm, std::min(M, m + 32) - m, out + m * ldo + n, ldo);
            continue;
          }
          // the last k block: its 32 rows, just stored (in L1), rounded to bf16 and written out
          for (int64_t i = m; i < std::min(M, m + 32); ++i) {
            const float* ci = cm + (i - m) * 32;
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(ci + 16), _mm512_load_ps(ci));
            if (cols == 32) _mm512_storeu_si512(out + i * ldo + n, v);
            else _mm512_mask_storeu_epi16(out + i * ldo + n, (__mmask32)((1ull << cols) - 1), v);
          }
        }
    }
  }
  _tile_release();
}
void units(const int32_t* packed, int64_t G, const int32_t* x, int64_t M, int64_t ldx, int64_t M16, const int32_t* tail,
           int64_t ldt, uint16_t* out, int64_t ldo, int64_t N, int64_t u0, int64_t u1, bool swiglu) {
  if (swiglu) amx_units<true>(packed, G, x, M, ldx, M16, tail, ldt, out, ldo, N, u0, u1);
  else amx_units<false>(packed, G, x, M, ldx, M16, tail, ldt, out, ldo, N, u0, u1);
}
}  // namespace isa_amx
#pragma GCC pop_options
