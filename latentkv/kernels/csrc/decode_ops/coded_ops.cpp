// A transform-coded cache (cache/coded.py) in native calls: its writer, which the layers (model/fused.py
// write_latent) and the decode plan both call, and the plan's map of the rope query into the kernel's row.
// Both give the reference's bits (cache/coded.py encode, cache/transform_code.py encode, rope.py rotate;
// attention/native_backend.py coded_latent_attention): the matmuls are the reference's own (torch's, or
// qlinear's where the reference runs qlinear), and every other step is the reference's operation, value by
// value, rounded where torch rounds (this unit is compiled for the baseline ISA: no FMA, nothing contracts).
// So the codes are those the conversion's simulation measured (tests/cache/test_coded.py) and a plan step
// equals a module step (tests/model/test_decode_plan.py); what goes is the Python and the torch ops between.
#include "coded_ops.h"

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t ROWS_GRAIN = 64;  // tokens a thread takes at least (a prompt's rows split; a decode step's not)
constexpr int64_t TC_WRITE_GROUPS = 512;  // scale groups a side may have (mla_decode_coded's TC_MAX_GROUPS a token)

// invariant.linear on float32 rows: x [M, K] @ w [N, K]ᵀ with M padded by zero rows to a multiple of 4 below
// invariant.SAFE_ROWS (MKL's small-M kernels round otherwise), the padding's rows dropped.
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w) {
  constexpr int64_t SAFE_ROWS = 12;
  const int64_t m = x.size(0), padded = m >= SAFE_ROWS || m % 4 == 0 ? m : (m + 3) / 4 * 4;
  if (padded == m) return at::linear(x, w);
  return at::linear(at::constant_pad_nd(x, {0, 0, 0, padded - m}), w).narrow(0, 0, m);
}

// Rounds a float32 value to the model dtype T and back, as torch's `.to(T)` then `.float()` do (bf16: to
// nearest even; float32: nothing).
template <typename T>
inline float in_dtype(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// The rows the code quantizes, float32: each token's c less the latent's mean (in the model dtype T) ->
// xl [T, r], and its k_r rotated by its angles (rope.rotate: float32 products, rounded to T) less the rope
// key's mean turned the same way -> xr [T, dr]. Each value the reference's: its operations one by one, each
// rounded as torch rounds it (this unit compiles without FMA: nothing contracts).
template <typename T>
void centred_rows(const at::Tensor& c, const at::Tensor& k_r, const at::Tensor& cos, const at::Tensor& sin,
                  const PlanCoded& code, float* xl, float* xr) {
  const int64_t n = c.size(0), r = c.size(1), dr = k_r.size(1), half = dr / 2;
  const T* cp = c.data_ptr<T>();
  const T* kp = k_r.data_ptr<T>();
  const float* cosp = cos.data_ptr<float>();
  const float* sinp = sin.data_ptr<float>();
  const bool centred = code.latent_mean.defined(), interleaved = code.interleaved;
  const float* lm = centred ? code.latent_mean.data_ptr<float>() : nullptr;
  const float* rm = centred ? code.rope_mean.data_ptr<float>() : nullptr;
  // (strides read once: the rows may be views of the projection's output)
  const int64_t c0 = c.stride(0), c1 = c.stride(1), k0 = k_r.stride(0), k1 = k_r.stride(1);
  const int64_t cos0 = cos.stride(0), cos1 = cos.stride(1), sin0 = sin.stride(0), sin1 = sin.stride(1);
  at::parallel_for(0, n, ROWS_GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t i = 0; i < r; ++i) {
        const float v = static_cast<float>(cp[t * c0 + i * c1]);
        xl[t * r + i] = centred ? in_dtype<T>(v - in_dtype<T>(lm[i])) : v;
      }
      for (int64_t p = 0; p < half; ++p) {
        const int64_t ia = interleaved ? 2 * p : p, ib = interleaved ? 2 * p + 1 : p + half;
        const float a = static_cast<float>(kp[t * k0 + ia * k1]);
        const float b = static_cast<float>(kp[t * k0 + ib * k1]);
        const float cs = cosp[t * cos0 + p * cos1], sn = sinp[t * sin0 + p * sin1];
        float re = in_dtype<T>(a * cs - b * sn), im = in_dtype<T>(b * cs + a * sn);
        if (centred) {
          re = in_dtype<T>(re - in_dtype<T>(rm[ia] * cs - rm[ib] * sn));
          im = in_dtype<T>(im - in_dtype<T>(rm[ib] * cs + rm[ia] * sn));
        }
        xr[t * dr + ia] = re, xr[t * dr + ib] = im;
      }
    }
  });
}

// transform_code.encode's steps after the turn, for token row y [stored] of one side: each group's RMS (its
// squares summed in index order, as index_add_ sums them) as float16 -> scale [groups], and each value's
// code floor(y / (max(scale, float16 tiny) x STEP)) + half, clamped to [0, top] -> codes [stored].
void quantize_side(const float* y, const PlanCodedSide& s, at::Half* scale, uint8_t* codes) {
  const int64_t stored = s.group.numel(), groups = s.sizes.numel();
  const int64_t* group = s.group.data_ptr<int64_t>();
  const float* sizes = s.sizes.data_ptr<float>();
  const float* step = s.step.data_ptr<float>();
  const float* half = s.half.data_ptr<float>();
  const float* top = s.top.data_ptr<float>();
  float ms[TC_WRITE_GROUPS] = {};
  for (int64_t i = 0; i < stored; ++i) ms[group[i]] += y[i] * y[i];
  float wide[TC_WRITE_GROUPS];
  constexpr float FLOAT16_TINY = 6.103515625e-05f;  // torch.finfo(torch.float16).tiny
  for (int64_t g = 0; g < groups; ++g) {
    scale[g] = at::Half(std::sqrt(ms[g] / sizes[g]));
    const float f = static_cast<float>(scale[g]);
    wide[g] = f > FLOAT16_TINY || f != f ? f : FLOAT16_TINY;  // clamp(min=tiny): NaN stays NaN
  }
  for (int64_t i = 0; i < stored; ++i) {
    float q = std::floor(y[i] / (wide[group[i]] * step[i])) + half[i];
    q = q > 0.0f ? q : 0.0f;  // (NaN: 0)
    codes[i] = (uint8_t)(q < top[i] ? q : top[i]);
  }
}

}  // namespace

// c [T, r], k_r [T, dr] (not yet rotated) in the model dtype, cos / sin [T, dr/2] float32, slots [T] int64 ->
// each token's codes (bits packed least significant first, coded.pack's layout) and float16 scales written
// at its slot of codes [blocks, bs, code_bytes] uint8 and scales [blocks, bs, groups] float16. The rows'
// turns are torch's matmul (invariant.linear, as the reference); the rest one pass a token.
void coded_write(at::Tensor c, at::Tensor k_r, at::Tensor cos, at::Tensor sin, at::Tensor slots, at::Tensor codes,
                 at::Tensor scales, const PlanCoded& code) {
  const int64_t T = c.size(0), r = c.size(1), dr = k_r.size(1);
  TORCH_CHECK(c.dim() == 2 && k_r.dim() == 2 && k_r.size(0) == T && c.scalar_type() == k_r.scalar_type() &&
                  (c.scalar_type() == at::kFloat || c.scalar_type() == at::kBFloat16),
              "coded_write: c [T, r] and k_r [T, dr], both float32 or both bf16");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 2 && sin.dim() == 2 &&
                  cos.size(0) == T && sin.size(0) == T && cos.size(1) == dr / 2 && sin.size(1) == dr / 2 && dr % 2 == 0,
              "coded_write: cos and sin float32 [T, dr/2]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == T, "coded_write: slots int64 [T]");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 &&
                  scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 3,
              "coded_write: codes uint8 and scales float16 [blocks, bs, n], contiguous");
  const PlanCodedSide* sides[2] = {&code.latent_side, &code.rope_side};
  const int64_t stored[2] = {code.latent_side.group.numel(), code.rope_side.group.numel()};
  const int64_t groups[2] = {code.latent_side.sizes.numel(), code.rope_side.sizes.numel()};
  const at::Tensor widths = code.widths;
  TORCH_CHECK(widths.scalar_type() == at::kByte && widths.is_contiguous() && widths.numel() == stored[0] + stored[1],
              "coded_write: widths uint8, one a stored value");
  TORCH_CHECK(code.latent_side.turn.size(1) == r && code.rope_side.turn.size(1) == dr &&
                  groups[0] <= TC_WRITE_GROUPS && groups[1] <= TC_WRITE_GROUPS && groups[0] + groups[1] == scales.size(2),
              "coded_write: the code's turns take ", code.latent_side.turn.size(1), " + ", code.rope_side.turn.size(1),
              " values and its groups ", groups[0], " + ", groups[1], "; the rows give ", r, " + ", dr, ", the cache holds ",
              scales.size(2), " scales");
  TORCH_CHECK(!code.latent_mean.defined() || (code.latent_mean.numel() == r && code.rope_mean.numel() == dr),
              "coded_write: means of ", r, " and ", dr, " values");
  int64_t bits = 0;
  const uint8_t* w = widths.data_ptr<uint8_t>();
  for (int64_t i = 0; i < widths.numel(); ++i) bits += w[i];
  const int64_t code_bytes = codes.size(2), capacity = codes.size(0) * codes.size(1), G = scales.size(2);
  TORCH_CHECK((bits + 7) / 8 == code_bytes, "coded_write: ", bits, " bits a token, the cache holds ", code_bytes, " bytes");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(0 <= slot[t] && slot[t] < capacity, "coded_write: slot ", slot[t], " outside the cache's ", capacity);

  const auto f32 = c.options().dtype(at::kFloat);
  at::Tensor x[2] = {at::empty({T, r}, f32), at::empty({T, dr}, f32)};
  if (c.scalar_type() == at::kBFloat16)
    centred_rows<at::BFloat16>(c, k_r, cos, sin, code, x[0].data_ptr<float>(), x[1].data_ptr<float>());
  else
    centred_rows<float>(c, k_r, cos, sin, code, x[0].data_ptr<float>(), x[1].data_ptr<float>());
  at::Tensor y[2];
  for (int k = 0; k < 2; ++k) y[k] = invariant_linear(x[k], sides[k]->turn).contiguous();  // transform_code.encode's turn

  at::parallel_for(0, T, ROWS_GRAIN, [&](int64_t begin, int64_t end) {  // (tokens apart: each its own slot)
    std::vector<uint8_t> values(stored[0] + stored[1]);
    std::vector<at::Half> scale(G);
    for (int64_t t = begin; t < end; ++t) {
      quantize_side(y[0].data_ptr<float>() + t * stored[0], *sides[0], scale.data(), values.data());
      quantize_side(y[1].data_ptr<float>() + t * stored[1], *sides[1], scale.data() + groups[0], values.data() + stored[0]);
      uint8_t* dst = codes.data_ptr<uint8_t>() + slot[t] * code_bytes;
      std::memset(dst, 0, code_bytes);
      for (int64_t i = 0, at = 0; i < (int64_t)values.size(); at += w[i], ++i) {  // b <= 8 bits: two bytes at most
        const uint32_t shifted = (uint32_t)values[i] << (at & 7);
        dst[at >> 3] |= (uint8_t)shifted;
        if (shifted >> 8) dst[(at >> 3) + 1] |= (uint8_t)(shifted >> 8);
      }
      std::memcpy(scales.data_ptr<at::Half>() + slot[t] * G, scale.data(), G * sizeof(at::Half));
    }
  });
}

// coded.reference_decode: codes [N, code_bytes] uint8, scales [N, groups] float16 of rows at angles cos, sin
// [N, dr/2] float32 (LayerCode.angles of their positions; empty where the code is not centred) -> out [N, r +
// dr] (float32 or bf16: the model dtype), each row [c ; k_r] with the means added back. The unpacking,
// (code - half + 1/2) x scale x STEP and the means value by value as the reference rounds them; the turns
// back torch's own op as the reference runs it.
void coded_read(at::Tensor codes, at::Tensor scales, at::Tensor cos, at::Tensor sin, at::Tensor out, const PlanCoded& code) {
  const PlanCodedSide* sides[2] = {&code.latent_side, &code.rope_side};
  const int64_t N = codes.size(0), stored[2] = {sides[0]->group.numel(), sides[1]->group.numel()};
  const int64_t groups[2] = {sides[0]->sizes.numel(), sides[1]->sizes.numel()};
  const int64_t n[2] = {sides[0]->turn.size(1), sides[1]->turn.size(1)}, width = n[0] + n[1];
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2 &&
                  scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 2 &&
                  scales.size(0) == N && scales.size(1) == groups[0] + groups[1],
              "coded_read: codes uint8 [N, code bytes] and scales float16 [N, ", groups[0] + groups[1], "], contiguous");
  const bool centred = code.latent_mean.defined();
  const int64_t half = n[1] / 2;
  for (const at::Tensor* a : {&cos, &sin})
    TORCH_CHECK(centred ? a->scalar_type() == at::kFloat && a->is_contiguous() && a->dim() == 2 && a->size(0) == N &&
                              a->size(1) == half
                        : a->numel() == 0,
                "coded_read: cos and sin float32 [N, ", half, "], contiguous, for a centred code; empty otherwise");
  TORCH_CHECK((out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) && out.is_contiguous() &&
                  out.dim() == 2 && out.size(0) == N && out.size(1) == width,
              "coded_read: out float32 or bf16 [N, ", width, "], contiguous");
  const uint8_t* w = code.widths.data_ptr<uint8_t>();
  int64_t bits = 0;
  for (int64_t i = 0; i < code.widths.numel(); ++i) bits += w[i];
  TORCH_CHECK(code.widths.numel() == stored[0] + stored[1] && (bits + 7) / 8 == codes.size(1), "coded_read: ", bits,
              " bits a token, the codes hold ", codes.size(1), " bytes");
  const auto f32 = codes.options().dtype(at::kFloat);
  at::Tensor y[2] = {at::empty({N, stored[0]}, f32), at::empty({N, stored[1]}, f32)};
  // every pointer and size read once, outside the rows' loops (each accessor call checks the tensor)
  const uint8_t* all_codes = codes.data_ptr<uint8_t>();
  const at::Half* all_scales = scales.data_ptr<at::Half>();
  const int64_t code_bytes = codes.size(1), scale_count = scales.size(1);
  const int64_t* group_of[2] = {sides[0]->group.data_ptr<int64_t>(), sides[1]->group.data_ptr<int64_t>()};
  const float* step_of[2] = {sides[0]->step.data_ptr<float>(), sides[1]->step.data_ptr<float>()};
  const float* half_of[2] = {sides[0]->half.data_ptr<float>(), sides[1]->half.data_ptr<float>()};
  float* y_of[2] = {y[0].data_ptr<float>(), y[1].data_ptr<float>()};
  at::parallel_for(0, N, ROWS_GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* src = all_codes + t * code_bytes;
      const at::Half* sc = all_scales + t * scale_count;
      int64_t at = 0, i = 0;
      for (int k = 0; k < 2; ++k) {
        const int64_t* group = group_of[k];
        const float* step = step_of[k];
        const float* half = half_of[k];
        float* dst = y_of[k] + t * stored[k];
        for (int64_t j = 0; j < stored[k]; at += w[i], ++i, ++j) {  // pack's layout: b <= 8 bits in two bytes
          const uint32_t pair = src[at >> 3] | ((at >> 3) + 1 < code_bytes ? (uint32_t)src[(at >> 3) + 1] << 8 : 0u);
          const float c = (float)((pair >> (at & 7)) & ((1u << w[i]) - 1));
          dst[j] = (c - half[j] + 0.5f) * (static_cast<float>(sc[group[j]]) * step[j]);
        }
        sc += groups[k];
      }
    }
  });
  at::Tensor x[2];
  for (int k = 0; k < 2; ++k) x[k] = invariant_linear(y[k], sides[k]->back).contiguous();  // transform_code.decode's
  const int64_t r = n[0], dr = n[1];
  auto fill = [&](auto* o, auto tag) {
    using T = decltype(tag);
    const float* lm = centred ? code.latent_mean.data_ptr<float>() : nullptr;
    const float* rm = centred ? code.rope_mean.data_ptr<float>() : nullptr;
    const float* cosp = centred ? cos.data_ptr<float>() : nullptr;
    const float* sinp = centred ? sin.data_ptr<float>() : nullptr;
    const float* x0 = x[0].data_ptr<float>();
    const float* x1 = x[1].data_ptr<float>();
    const bool interleaved = code.interleaved;
    at::parallel_for(0, N, ROWS_GRAIN, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* xl = x0 + t * r;
        const float* xr = x1 + t * dr;
        T* row = o + t * width;
        for (int64_t i = 0; i < r; ++i) row[i] = centred ? T(in_dtype<T>(xl[i]) + in_dtype<T>(lm[i])) : T(xl[i]);
        if (!centred) {
          for (int64_t i = 0; i < dr; ++i) row[r + i] = T(xr[i]);
          continue;
        }
        for (int64_t p = 0; p < half; ++p) {  // the rope key's mean turned (LayerCode.turned_mean), added in T
          const int64_t ia = interleaved ? 2 * p : p, ib = interleaved ? 2 * p + 1 : p + half;
          const float cs = cosp[t * half + p], sn = sinp[t * half + p];
          row[r + ia] = T(in_dtype<T>(xr[ia]) + in_dtype<T>(rm[ia] * cs - rm[ib] * sn));
          row[r + ib] = T(in_dtype<T>(xr[ib]) + in_dtype<T>(rm[ib] * cs + rm[ia] * sn));
        }
      }
    });
  };
  if (out.scalar_type() == at::kBFloat16) fill(out.data_ptr<at::BFloat16>(), at::BFloat16());
  else fill(out.data_ptr<float>(), 0.0f);
}

// KernelView.turn_rope: the rope query [B, H, dr] -> its columns of the kernel's row [B, H, E] in its dtype
// (the map in float32, through `linear` where the code holds it packed).
at::Tensor coded_rope_query(const at::Tensor& q_rope, const PlanCoded& code, LinearFn linear, int64_t caps_linear) {
  const at::Tensor flat = q_rope.reshape({-1, q_rope.size(-1)}).to(at::kFloat);
  const at::Tensor& w = code.rope_map;
  const at::Tensor mapped = code.rope_packed.defined() ? linear(flat, code.rope_packed, 32, w.size(0), caps_linear)
                                                       : invariant_linear(flat, w);
  return mapped.to(q_rope.scalar_type()).view({q_rope.size(0), q_rope.size(1), -1});
}
