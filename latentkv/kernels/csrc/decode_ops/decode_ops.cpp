// latentkv fused decode-step ops (CPU): the small per-layer operations between the weight matmuls,
// each one call instead of a chain of eager PyTorch ops. Python side: latentkv/kernels/decode_ops.py
// (build, switch: kernels/build.py), latentkv/model/fused.py (the PyTorch reference of each op). Shapes (float32 or bfloat16 activations):
//   head_matmul(x [N, H, K], w [H, K, C], scale, extra [N, H, E] or empty, caps, packed) -> [N, H, C + E]
//       in x's dtype (w in x's dtype, or bf16 under float32 x):
//       per head x·w (the absorbed query W_UKᵀ q_nope and the value W_UV o_lat), times scale,
//       with `extra` (the rotated q_rope) times scale beside it. Where caps has amx_bf16, with bf16 x and w,
//       on AMX tiles (head_amx.h) from `packed` = head_pack(w, caps) (empty: packed for the call).
//   rope(x [N, G, d], cos [N, d/2], sin, interleaved, caps, slots) -> rotated [N, G, d]; with slots
//       (int64 [d/2], else empty) pair i turns by column slots[i] of cos / sin [N, F].
//   write_latent(c [T, r], k_r [T, dr], cos [T, dr/2], sin, interleaved, slots [T], kv | latent,
//       scale, rope, qmax, caps): rotate k_r, quantize c (int8 / fp8 e4m3, scale per token) and store both
//       at their flat cache slots, in one pass.
//   silu_mul(gate_up [T, 2I], caps) -> silu(gate) * up [T, I].
//   rms_norm(x [T, d], weight [d], eps, residual [T, d] or empty, caps) -> (x + residual, its RMSNorm).
// caps: the capabilities that serve (cpu_isa.h); each op runs the best of its paths (PATHS) they include.
// Work is split with at::parallel_for: the same threads as torch (torch.set_num_threads). Each path's
// loops are their own unit (decode_ops_<isa>.cpp), reached through decode_ops_paths.h.
#include "coded_ops.h"  // a transform-coded cache's writer (its own unit: coded_ops.cpp)
#include "decode_ops.h"
#include "decode_ops_paths.h"
#include "decode_step.h"  // the whole decode step in one call, over the ops here (its own unit: decode_step.cpp)
#include "torch_lite.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>

#include "isa_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// The row loops of the best vector path caps allows (decode_ops_paths.h), scalar's where none.
RowPath row_path(int64_t caps) {
  return has(caps, NEEDS_AVX512) ? isa_avx512::row_path()
         : has(caps, NEEDS_AVX2) ? isa_avx2::row_path() : isa_scalar::row_path();
}

template <typename T>
inline float load(const T* p, int64_t i) { return (float)p[i]; }

template <typename T>
inline T cast(float v) { return (T)v; }  // c10::BFloat16(float) rounds to nearest even, as torch does

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
}

bool is_float(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

}  // namespace

// The paths beside scalar (decode_ops_paths.h has what each needs).
constexpr IsaPath PATHS[] = {{"avx2", NEEDS_AVX2}, {"avx512", NEEDS_AVX512}, {"amx_bf16", NEEDS_AMX_BF16}};

// The AMX path's weight layout (head_amx.h head_pack) for w [H, K, C] bf16, where that path applies
// under caps; else an empty tensor (head_matmul then takes its vector tiles).
at::Tensor head_pack(at::Tensor w, int64_t caps) {
  check_cpu(w, "head_pack: w");
  TORCH_CHECK(w.dim() == 3, "head_pack: w must be [H, K, C]");
  const int64_t H = w.size(0), K = w.size(1), C = w.size(2);
  check_caps(caps, "head_pack");
  if (!has(caps, NEEDS_AMX_BF16) || w.scalar_type() != at::kBFloat16 || !isa_amx::head_applies(K, C))
    return at::empty({0}, w.options());
  w = w.contiguous();
  auto out = at::empty({H, isa_amx::head_steps((int)K), 16, C, 2}, w.options());
  isa_amx::head_pack((const uint16_t*)w.data_ptr(), H, (int)K, (int)C, (uint16_t*)out.data_ptr());
  return out;
}

at::Tensor head_matmul(at::Tensor x, at::Tensor w, double scale, at::Tensor extra, int64_t caps, at::Tensor packed) {
  check_cpu(x, "head_matmul: x");
  check_caps(caps, "head_matmul");
  TORCH_CHECK(x.dim() == 3 && w.dim() == 3 && x.size(1) == w.size(0) && x.size(2) == w.size(1),
              "head_matmul: x must be [N, H, K] and w [H, K, C]");
  TORCH_CHECK(is_float(x) && is_float(w) && (w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kBFloat16),
              "head_matmul: x and w must be float32 or bfloat16 (w bfloat16 under float32 x: widened, exact)");
  w = w.contiguous();
  const int64_t N = x.size(0), H = x.size(1), K = x.size(2), C = w.size(2);
  const int64_t E = extra.numel() > 0 ? extra.size(2) : 0;
  if (E > 0)
    TORCH_CHECK(extra.dim() == 3 && extra.size(0) == N && extra.size(1) == H && extra.scalar_type() == x.scalar_type(),
                "head_matmul: extra must be [N, H, E] in x's dtype");
  auto out = at::empty({N, H, C + E}, x.options());
  if (N == 0) return out;
  if (has(caps, NEEDS_AMX_BF16) && x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 &&
      isa_amx::head_applies(K, C)) {
    if (packed.numel() == 0) packed = head_pack(w, caps);
    TORCH_CHECK(packed.dim() == 5 && packed.size(0) == H && packed.size(1) == isa_amx::head_steps((int)K) &&
                packed.size(3) == C, "head_matmul: packed must be head_pack(w)");
    isa_amx::head_matmul_amx(x, packed, (float)scale, extra, out);
    return out;
  }
  constexpr int64_t CHUNK = 64;  // rows per work item
  const int64_t chunks = (N + CHUNK - 1) / CHUNK;
  const bool bf16 = w.scalar_type() == at::kBFloat16;  // the weight's storage picks the inner loop
  const RowPath path = row_path(caps);
  const auto rows_f32 = path.head_rows_f32;
  const auto rows_bf16 = path.head_rows_bf16;
  const auto out_bf16 = path.head_out_bf16;
  const float s = (float)scale;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "head_matmul", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* ep = E > 0 ? extra.data_ptr<scalar_t>() : nullptr;
    const int64_t sxn = x.stride(0), sxh = x.stride(1), sxk = x.stride(2);
    const int64_t sen = E > 0 ? extra.stride(0) : 0, seh = E > 0 ? extra.stride(1) : 0, sek = E > 0 ? extra.stride(2) : 0;
    scalar_t* op = out.data_ptr<scalar_t>();
    const void* wp = w.data_ptr();
    const int64_t cap = std::min(CHUNK, N);  // a decode step has a row or a few: 64 rows' buffers were ~155 KB zeroed per layer
    at::parallel_for(0, H * chunks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> xs(cap * K), acc(cap * C);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t h = item / chunks, n0 = (item % chunks) * CHUNK;
        const int64_t rows = std::min(CHUNK, N - n0);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t k = 0; k < K; ++k) xs[i * K + k] = load(xp, (n0 + i) * sxn + h * sxh + k * sxk);
        if (bf16)
          rows_bf16(xs.data(), (int)rows, (int)K, (const uint16_t*)wp + h * K * C, (int)C, acc.data());
        else
          rows_f32(xs.data(), (int)rows, (int)K, (const float*)wp + h * K * C, (int)C, acc.data());
        for (int64_t i = 0; i < rows; ++i) {
          scalar_t* o = op + ((n0 + i) * H + h) * (C + E);
          if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
            if (E == 0 || sek == 1) {  // the vector rounding of one ISA (the bits of the loop below)
              out_bf16(acc.data() + i * C, C, E ? (const uint16_t*)(ep + (n0 + i) * sen + h * seh) : nullptr, E, s, (uint16_t*)o);
              continue;
            }
          }
          for (int64_t c = 0; c < C; ++c) o[c] = cast<scalar_t>(acc[i * C + c] * s);
          for (int64_t e = 0; e < E; ++e) o[C + e] = cast<scalar_t>(load(ep, (n0 + i) * sen + h * seh + e * sek) * s);
        }
      }
    });
  });
  return out;
}

namespace {

// The row loops rope and write_latent take from one path (decode_ops_impl.h); scalar is the reference.
struct RowOps {
  void (*rotate_f32)(const float*, int64_t, const float*, const float*, bool, float*);
  void (*rotate_bf16)(const uint16_t*, int64_t, const float*, const float*, bool, float*);
  void (*round_bf16)(float*, int64_t, uint16_t*, bool);
  float (*absmax_f32)(const float*, int64_t);
  float (*absmax_bf16)(const uint16_t*, int64_t);
  void (*quantize_f32)(const float*, int64_t, float, int8_t*);
  void (*quantize_bf16)(const uint16_t*, int64_t, float, int8_t*);

  void rotate(const float* x, int64_t d, const float* cs, const float* sn, bool il, float* out) const { rotate_f32(x, d, cs, sn, il, out); }
  void rotate(const uint16_t* x, int64_t d, const float* cs, const float* sn, bool il, float* out) const { rotate_bf16(x, d, cs, sn, il, out); }
  float absmax(const float* x, int64_t n) const { return absmax_f32(x, n); }
  float absmax(const uint16_t* x, int64_t n) const { return absmax_bf16(x, n); }
  void quantize(const float* x, int64_t n, float s, int8_t* out) const { quantize_f32(x, n, s, out); }
  void quantize(const uint16_t* x, int64_t n, float s, int8_t* out) const { quantize_bf16(x, n, s, out); }
  // row [n] (float32) stored as T: bf16 rounded to nearest even, float32 as it is
  void store(float* row, int64_t n, uint16_t* out) const { round_bf16(row, n, out, false); }
  void store(float* row, int64_t n, float* out) const { std::memcpy(out, row, n * sizeof(float)); }
};

RowOps row_ops(int64_t caps) {
  check_caps(caps, "decode_ops");
  const RowPath p = row_path(caps);
  return {p.rotate_f32, p.rotate_bf16, p.round_bf16, p.absmax_f32, p.absmax_bf16, p.quantize_f32, p.quantize_bf16};
}

// A float tensor's storage as the row loops read it: float, or bf16 bits.
template <typename scalar_t>
using bits_t = std::conditional_t<std::is_same_v<scalar_t, at::BFloat16>, uint16_t, float>;

// t with its last dimension unit-strided (the row loops read contiguous values).
at::Tensor unit_last(const at::Tensor& t) { return t.size(-1) > 1 && t.stride(-1) != 1 ? t.contiguous() : t; }

}  // namespace

at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin, bool interleaved, int64_t caps, at::Tensor slots) {
  check_cpu(x, "rope: x");
  TORCH_CHECK(x.dim() == 3 && is_float(x), "rope: x must be [N, G, d] float32 or bfloat16");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "rope: cos/sin must be float32");
  cos = cos.contiguous(), sin = sin.contiguous(), x = unit_last(x), slots = slots.contiguous();
  const int64_t N = x.size(0), G = x.size(1), d = x.size(2);
  const bool pick = slots.numel() > 0;  // pair i turns by column slots[i] of cos / sin [N, F]
  const int64_t F = pick ? cos.size(-1) : d / 2;
  TORCH_CHECK(d % 2 == 0 && cos.numel() == N * F && sin.numel() == N * F, "rope: cos/sin must be [N, d/2] (or [N, F] with slots)");
  if (pick) {
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == d / 2, "rope: slots must be int64 [d/2]");
    for (int64_t i = 0; i < d / 2; ++i)
      TORCH_CHECK(slots.data_ptr<int64_t>()[i] >= 0 && slots.data_ptr<int64_t>()[i] < F, "rope: a slot outside cos/sin");
  }
  const int64_t* sl = pick ? slots.data_ptr<int64_t>() : nullptr;
  const RowOps ops = row_ops(caps);
  auto out = at::empty({N, G, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rope", [&] {
    using B = bits_t<scalar_t>;
    const B* xp = (const B*)x.data_ptr();
    B* op = (B*)out.data_ptr();
    const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    const int64_t sn = x.stride(0), sg = x.stride(1);
    at::parallel_for(0, N * G, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> row(d), picked(d);  // picked: a row's cos then sin columns, gathered once per n
      int64_t held = -1;
      for (int64_t ng = begin; ng < end; ++ng) {
        const int64_t n = ng / G, g = ng % G;
        const float *cs = cp + n * F, *sn_ = sp + n * F;
        if (pick) {
          if (held != n) {
            for (int64_t i = 0; i < d / 2; ++i) picked[i] = cs[sl[i]], picked[d / 2 + i] = sn_[sl[i]];
            held = n;
          }
          cs = picked.data(), sn_ = picked.data() + d / 2;
        }
        ops.rotate(xp + n * sn + g * sg, d, cs, sn_, interleaved, row.data());
        ops.store(row.data(), d, op + ng * d);
      }
    });
  });
  return out;
}

void write_latent(at::Tensor c, at::Tensor k_r, at::Tensor cos, at::Tensor sin, bool interleaved,
                  at::Tensor slots, at::Tensor kv, at::Tensor latent, at::Tensor scale, at::Tensor rope_cache,
                  double qmax, int64_t caps) {
  check_cpu(c, "write_latent: c");
  TORCH_CHECK(c.dim() == 2 && k_r.dim() == 2 && c.size(0) == k_r.size(0) && is_float(c) && k_r.scalar_type() == c.scalar_type(),
              "write_latent: c [T, r] and k_r [T, dr] must share a float dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == c.size(0), "write_latent: slots must be int64 [T]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "write_latent: cos/sin must be float32");
  slots = slots.contiguous(), cos = cos.contiguous(), sin = sin.contiguous(), c = unit_last(c), k_r = unit_last(k_r);
  const int64_t T = c.size(0), r = c.size(1), dr = k_r.size(1);
  TORCH_CHECK(dr % 2 == 0 && cos.numel() == T * (dr / 2), "write_latent: cos/sin must be [T, dr/2]");
  const bool quantized = kv.numel() == 0;
  int64_t slot_count;
  if (quantized) {
    TORCH_CHECK(latent.is_contiguous() && scale.is_contiguous() && rope_cache.is_contiguous() && latent.size(-1) == r &&
                    scale.scalar_type() == at::kFloat &&
                    (rope_cache.scalar_type() == c.scalar_type() || rope_cache.scalar_type() == at::kBFloat16 ||
                     rope_cache.scalar_type() == at::kChar) &&
                    (latent.scalar_type() == at::kChar || latent.scalar_type() == at::kByte),
                "write_latent: latent [.., r] int8|uint8, scale float32, rope in c's dtype, bf16 or int8, all contiguous");
    slot_count = latent.numel() / r;
    TORCH_CHECK(scale.numel() == slot_count * (rope_cache.scalar_type() == at::kChar ? 2 : 1),
                "write_latent: scale must hold one float per slot (two with an int8 rope)");
  } else {
    TORCH_CHECK(kv.is_contiguous() && kv.size(-1) == r + dr && kv.scalar_type() == c.scalar_type(),
                "write_latent: kv must be contiguous [.., r + dr] in c's dtype");
    slot_count = kv.numel() / (r + dr);
  }
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < slot_count, "write_latent: slot ", sp[t], " outside the cache");
  const bool fp8 = quantized && latent.scalar_type() == at::kByte;
  const bool rope16 = quantized && rope_cache.scalar_type() == at::kBFloat16 && c.scalar_type() != at::kBFloat16;
  const bool rope8 = quantized && rope_cache.scalar_type() == at::kChar;  // scale: [slot][latent's, rope's]
  const int64_t stride = rope8 ? 2 : 1;
  const float q = (float)qmax;
  const RowOps ops = row_ops(caps);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, c.scalar_type(), "write_latent", [&] {
    using B = bits_t<scalar_t>;
    const B *cp = (const B*)c.data_ptr(), *kp = (const B*)k_r.data_ptr();
    const int64_t scn = c.stride(0), skn = k_r.stride(0);
    const float *cosp = cos.data_ptr<float>(), *sinp = sin.data_ptr<float>();
    float* scales = quantized ? scale.data_ptr<float>() : nullptr;
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(dr);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t slot = sp[t];
        const B* ct = cp + t * scn;
        ops.rotate(kp + t * skn, dr, cosp + t * (dr / 2), sinp + t * (dr / 2), interleaved, row.data());
        if (rope8) {  // as quantize_latent on the rotated key in c's dtype: scale = max|k| / 127
          if constexpr (std::is_same_v<B, uint16_t>) ops.round_bf16(row.data(), dr, nullptr, true);
          const float s = std::max(ops.absmax(row.data(), dr), 1e-12f) / 127.0f;
          scales[slot * 2 + 1] = dr ? s : 1.0f;
          ops.quantize(row.data(), dr, s, rope_cache.data_ptr<int8_t>() + slot * dr);
        } else if (rope16) {  // a float32 model's quantized cache (cache/latent_cache.py rope_dtype)
          ops.round_bf16(row.data(), dr, (uint16_t*)rope_cache.data_ptr() + slot * dr, false);
        } else {
          B* rope_out = quantized ? (B*)rope_cache.data_ptr() + slot * dr : (B*)kv.data_ptr() + slot * (r + dr) + r;
          ops.store(row.data(), dr, rope_out);
        }
        if (!quantized) {
          std::memcpy((B*)kv.data_ptr() + slot * (r + dr), ct, r * sizeof(B));
          continue;
        }
        // as cache/latent_cache.py quantize_latent: scale = max|c| / qmax; codes = c / scale
        const float s = std::max(ops.absmax(ct, r), 1e-12f) / q;
        scales[slot * stride] = s;
        if (fp8) {
          const scalar_t* cs = (const scalar_t*)ct;
          uint8_t* out = latent.data_ptr<uint8_t>() + slot * r;
          for (int64_t i = 0; i < r; ++i) out[i] = c10::Float8_e4m3fn(load(cs, i) / s).x;
        } else {
          ops.quantize(ct, r, s, latent.data_ptr<int8_t>() + slot * r);
        }
      }
    });
  });
}

std::vector<at::Tensor> rms_norm(at::Tensor x, at::Tensor weight, double eps, at::Tensor residual, int64_t caps) {
  check_cpu(x, "rms_norm: x");
  TORCH_CHECK(x.dim() == 2 && is_float(x) && weight.dim() == 1 && weight.size(0) == x.size(1),
              "rms_norm: x must be [T, d] float32 or bfloat16, weight [d]");
  const bool add = residual.numel() > 0;
  if (add)
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
                "rms_norm: residual must match x");
  x = x.contiguous(), weight = weight.contiguous(), residual = residual.contiguous();
  const int64_t T = x.size(0), d = x.size(1);
  auto out = at::empty_like(x);
  auto sum = add ? at::empty_like(x) : x;
  const auto st = x.scalar_type();
  if (weight.scalar_type() == st && (st == at::kBFloat16 || st == at::kFloat) && cpu_runs(caps)) {
    // the vectorized rows (decode_ops_impl.h), one instruction set
    const float e = (float)eps;
    if (st == at::kBFloat16) {
      using Rows = void (*)(const uint16_t*, const uint16_t*, uint16_t*, const uint16_t*, float, uint16_t*, int64_t, int64_t,
                            int64_t, float*);
      Rows rows = row_path(caps).rms_norm_bf16;
      const uint16_t *xp = (const uint16_t*)x.data_ptr(), *rp = add ? (const uint16_t*)residual.data_ptr() : nullptr,
                     *wp = (const uint16_t*)weight.data_ptr();
      uint16_t *sp = add ? (uint16_t*)sum.data_ptr() : nullptr, *op = (uint16_t*)out.data_ptr();
      at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> row(d);
        rows(xp, rp, sp, wp, e, op, begin, end, d, row.data());
      });
    } else {
      using Rows = void (*)(const float*, const float*, float*, const float*, float, float*, int64_t, int64_t, int64_t, float*);
      Rows rows = row_path(caps).rms_norm_f32;
      const float *xp = x.data_ptr<float>(), *rp = add ? residual.data_ptr<float>() : nullptr, *wp = weight.data_ptr<float>();
      float *sp = add ? sum.data_ptr<float>() : nullptr, *op = out.data_ptr<float>();
      at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> row(d);
        rows(xp, rp, sp, wp, e, op, begin, end, d, row.data());
      });
    }
    return {sum, out};
  }
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, weight.scalar_type(), "rms_norm_weight", [&] {
      using w_t = scalar_t;
      const w_t* wp = weight.data_ptr<w_t>();
      AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm_x", [&] {
        const scalar_t* xp = x.data_ptr<scalar_t>();
        const scalar_t* rp = add ? residual.data_ptr<scalar_t>() : nullptr;
        scalar_t* sp = sum.data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
          std::vector<float> row(d);
          for (int64_t t = begin; t < end; ++t) {
            float ss = 0.0f;
            for (int64_t i = 0; i < d; ++i) {
              float v = load(xp, t * d + i);
              if (add) {  // the residual stream is rounded to the activation dtype, as x + h is
                scalar_t s = cast<scalar_t>(v + load(rp, t * d + i));
                sp[t * d + i] = s;
                v = (float)s;
              }
              row[i] = v;
              ss += v * v;
            }
            // as aten's rms_norm: float32 statistics, x * rsqrt(mean(x^2) + eps) * weight, one rounding
            const float rs = 1.0f / std::sqrt(ss / (float)d + (float)eps);
            for (int64_t i = 0; i < d; ++i) op[t * d + i] = cast<scalar_t>(row[i] * rs * load(wp, i));
          }
        });
      });
  });
  return {sum, out};
}

#include "swiglu.h"  // common/: silu_mul, the MoE op's too

SiluRows silu_rows(int64_t caps) { return row_path(caps).silu; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_decode_plan(m);
  // the GIL released while the kernels run: the server's event loop and tokenizer thread go on beside them
  m.def("head_matmul", &head_matmul, py::call_guard<py::gil_scoped_release>(), "per-head x·w times scale, with extra columns beside (see decode_ops.cpp)");
  m.def("head_pack", &head_pack, py::call_guard<py::gil_scoped_release>(), "w [H, K, C] in head_matmul's AMX layout, or empty where that path does not apply");
  m.def("rope", &rope, py::call_guard<py::gil_scoped_release>(), "rotate [N, G, d] by cos/sin [N, d/2]");
  m.def("write_latent", &write_latent, py::call_guard<py::gil_scoped_release>(), "rope on k_r + quantization + write into the paged cache");
  m.def("coded_read", &coded_read, py::call_guard<py::gil_scoped_release>(), "a transform-coded cache's rows dequantized, the means added back (see coded_ops.cpp)");
  m.def("coded_write", &coded_write, py::call_guard<py::gil_scoped_release>(), "rope on k_r + transform code + write into a coded paged cache (see coded_ops.cpp)");
  m.def("rms_norm", &rms_norm, py::call_guard<py::gil_scoped_release>(), "(x + residual, rms_norm(x + residual)); without residual (x, rms_norm(x))");
  m.def("silu_mul", &silu_mul, py::call_guard<py::gil_scoped_release>(), "silu(gate) * up");
  def_isa_paths(m, PATHS);
}
