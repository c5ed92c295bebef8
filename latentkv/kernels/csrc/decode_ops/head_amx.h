// head_matmul's AMX path (the amx_bf16 path: cpu_isa.h): bf16 rows x [R, K] times one head's bf16 weight
// w [K, C] on tiles (TDPBF16PS), for the absorbed MLA's per-head products (W_UK^T q_nope, W_UV o_lat)
// of a decode step. Included by decode_ops_amx.cpp inside `namespace isa_amx` after amx_tiles.h (and torch);
// decode_ops_paths.h declares what the entries call (head_applies, head_pack, head_matmul_amx).
//
//   A: 16 rows x 32 values of x (row-major, as the rows lie: no packing of the activations);
//   B: the weight in pairs of k for every 16 columns, packed once per weight (head_pack), in
//      amx_tiles.h's steps (a last K % 32 values read as the row's last 32, the repeated pairs zero
//      in the pack), so every tile is 16 rows x 64 bytes;
//   C: 16 rows x 16 columns summed in float32 over the steps, four column blocks at a time
//      (amx_tiles.h amx_sum_blocks, the AMX decode kernel's value sums too).
// Each output is one tile lane's sum in the instruction's order over the steps: a row's bits depend
// on its own values only (batch-invariant), not on the other rows of the call.
// Applies where K >= 32 and even and C % 16 == 0 (decode_ops_paths.h head_applies); elsewhere the vector tiles serve.

// w [H, K, C] bf16 bits -> packed [H, steps, 16, C, 2]: pair p of step s holds (w[k][c], w[k+1][c]),
// k = amx_step_offset(s) + 2p, where k is new to step s (k >= 32s); zero elsewhere.
void head_pack(const uint16_t* w, int64_t H, int K, int C, uint16_t* out) {
  const int steps = amx_steps(K);
  for (int64_t h = 0; h < H; ++h)
    for (int s = 0; s < steps; ++s)
      for (int p = 0, off = amx_step_offset(s, K); p < 16; ++p) {
        uint16_t* dst = out + ((h * steps + s) * 16 + p) * (int64_t)C * 2;
        const int k = off + 2 * p;
        for (int c = 0; c < C; ++c) {
          const bool fresh = k >= 32 * s;
          dst[2 * c] = fresh ? w[(h * K + k) * (int64_t)C + c] : 0;
          dst[2 * c + 1] = fresh ? w[(h * K + k + 1) * (int64_t)C + c] : 0;
        }
      }
}

static void head_configure() { amx_configure(); }
static void head_release() { _tile_release(); }

// acc [16, C] (float32, row stride C) = x16 [16, K] (bf16, row stride K; rows past the call's zero)
// . w (one head's packed blocks), in C tiles over every step (amx_tiles.h amx_sum_blocks).
static void head_rows_amx(const uint16_t* x16, int K, const uint16_t* packed, int C, float* acc) {
  amx_sum_blocks(
      amx_steps(K), C / 16, [&](int s) { return x16 + amx_step_offset(s, K); }, K * 2,
      [&](int s) { return packed + (int64_t)s * 16 * C * 2; }, C * 4, acc, C);
}

// head_matmul on AMX tiles (bf16 x and w; packed from head_pack): work items of (head, 64 rows).
void head_matmul_amx(const at::Tensor& x, const at::Tensor& packed, float s, const at::Tensor& extra, at::Tensor& out) {
  const int64_t N = x.size(0), H = x.size(1), K = x.size(2), C = packed.size(3), E = out.size(2) - C;
  constexpr int64_t CHUNK = 64;
  const int64_t chunks = (N + CHUNK - 1) / CHUNK, steps = packed.size(1);
  const uint16_t* xp = (const uint16_t*)x.data_ptr();
  const uint16_t* pp = (const uint16_t*)packed.data_ptr();
  const c10::BFloat16* ep = E > 0 ? extra.data_ptr<c10::BFloat16>() : nullptr;
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const int64_t sxn = x.stride(0), sxh = x.stride(1), sxk = x.stride(2);
  const int64_t sen = E > 0 ? extra.stride(0) : 0, seh = E > 0 ? extra.stride(1) : 0, sek = E > 0 ? extra.stride(2) : 0;
  const int64_t cap = (std::min(CHUNK, N) + 15) / 16 * 16;
  at::parallel_for(0, H * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> xs(cap * K);
    std::vector<float> acc(16 * C);
    const __m512 sv = _mm512_set1_ps(s);
    head_configure();
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / chunks, n0 = (item % chunks) * CHUNK, rows = std::min(CHUNK, N - n0);
      const int64_t padded = (rows + 15) / 16 * 16;
      for (int64_t i = 0; i < padded; ++i) {  // the rows as A operands (rows past N: zeros)
        const uint16_t* src = xp + (n0 + i) * sxn + h * sxh;
        if (i >= rows) std::fill(xs.begin() + i * K, xs.begin() + (i + 1) * K, (uint16_t)0);
        else if (sxk == 1) std::memcpy(xs.data() + i * K, src, K * 2);
        else for (int64_t k = 0; k < K; ++k) xs[i * K + k] = src[k * sxk];
      }
      for (int64_t g = 0; g < padded; g += 16) {
        head_rows_amx(xs.data() + g * K, (int)K, pp + h * steps * 16 * C * 2, (int)C, acc.data());
        for (int64_t i = g; i < std::min(g + 16, rows); ++i) {
          c10::BFloat16* o = op + ((n0 + i) * H + h) * (C + E);
          const float* a = acc.data() + (i - g) * C;
          for (int64_t c = 0; c < C; c += 16)  // round to nearest even, as c10::BFloat16(float)
            _mm256_storeu_si256((__m256i*)(o + c), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(a + c), sv)));
          for (int64_t e = 0; e < E; ++e) o[C + e] = c10::BFloat16((float)ep[(n0 + i) * sen + h * seh + e * sek] * s);
        }
      }
    }
    head_release();
  });
}
