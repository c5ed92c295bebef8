// A transform-coded cache (cache/coded.py) in native calls: its writer, which the layers (model/fused.py
// write_latent) and the decode plan both call, and the plan's reader around attention's mla_decode_coded.
// Both run torch's own ops in the order the reference runs them (cache/coded.py encode, cache/transform_code.py
// encode, rope.py rotate; attention/native_backend.py coded_latent_attention), so their bits are the
// reference's: the codes the simulation of the conversion measured (tests/cache/test_coded.py), and a
// plan step equal to a module step (tests/model/test_decode_plan.py). What goes is the Python between the
// ops; the bits are packed here in one loop instead of the reference's index_add.
#include "coded_ops.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <cstring>
#include <utility>

namespace {

// invariant.linear on float32 rows: x [M, K] @ w [N, K]ᵀ with M padded by zero rows to a multiple of 4 below
// invariant.SAFE_ROWS (MKL's small-M kernels round otherwise), the padding's rows dropped.
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w) {
  constexpr int64_t SAFE_ROWS = 12;
  const int64_t m = x.size(0), padded = m >= SAFE_ROWS || m % 4 == 0 ? m : (m + 3) / 4 * 4;
  if (padded == m) return at::linear(x, w);
  return at::linear(at::constant_pad_nd(x, {0, 0, 0, padded - m}), w).narrow(0, 0, m);
}

// rope.rotate of x [..., d] float32 by cos / sin [..., d/2] (broadcast): interleaved pairs or halves.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  const int64_t d = x.size(-1);
  const at::Tensor a = interleaved ? x.slice(-1, 0, d, 2) : x.slice(-1, 0, d / 2);
  const at::Tensor b = interleaved ? x.slice(-1, 1, d, 2) : x.slice(-1, d / 2, d);
  at::Tensor re = a.mul(cos).sub(b.mul(sin)), im = b.mul(cos).add(a.mul(sin));
  return interleaved ? at::stack({re, im}, -1).flatten(-2) : at::cat({re, im}, -1);
}

// transform_code.encode of one side: x [T, n] -> (codes [T, stored] uint8, scales [T, groups] float16).
std::pair<at::Tensor, at::Tensor> encode_side(const at::Tensor& x, const PlanCodedSide& s) {
  const at::Tensor y = invariant_linear(x.to(at::kFloat), s.turn);
  at::Tensor ms = at::zeros({x.size(0), s.sizes.size(0)}, y.options()).index_add_(1, s.group, y.square());
  at::Tensor scale = ms.div(s.sizes).sqrt().to(at::kHalf);
  constexpr double FLOAT16_TINY = 6.103515625e-05;  // torch.finfo(torch.float16).tiny
  at::Tensor step = scale.to(at::kFloat).clamp_min(FLOAT16_TINY).index_select(1, s.group).mul(s.step);
  at::Tensor codes = at::floor(y.div(step)).add(s.half).clamp_min_(0).minimum(s.top).to(at::kByte);
  return {codes, scale};
}

// A coded map: x [M, K] float32 @ w [N, K]ᵀ by qlinear's float32 record where packed, else invariant_linear
// (KernelView._map).
at::Tensor map_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& packed, LinearFn linear, int64_t caps) {
  return packed.defined() ? linear(x, packed, 32, w.size(0), caps) : invariant_linear(x, w);
}

}  // namespace

// c [T, r], k_r [T, dr] (not yet rotated) in the model dtype, cos / sin [T, dr/2] float32, slots [T] int64 ->
// each token's codes (bits packed least significant first, coded.pack's layout) and float16 scales written
// at its slot of codes [blocks, bs, code_bytes] uint8 and scales [blocks, bs, groups] float16.
void coded_write(at::Tensor c, at::Tensor k_r, at::Tensor cos, at::Tensor sin, at::Tensor slots, at::Tensor codes,
                 at::Tensor scales, const PlanCoded& code) {
  const int64_t T = c.size(0);
  TORCH_CHECK(c.dim() == 2 && k_r.dim() == 2 && k_r.size(0) == T && c.scalar_type() == k_r.scalar_type(),
              "coded_write: c [T, r] and k_r [T, dr] of one dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == T, "coded_write: slots int64 [T]");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 &&
                  scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 3,
              "coded_write: codes uint8 and scales float16 [blocks, bs, n], contiguous");
  const at::Tensor widths = code.widths;
  TORCH_CHECK(widths.scalar_type() == at::kByte && widths.is_contiguous(), "coded_write: widths uint8");
  int64_t bits = 0;
  const uint8_t* w = widths.data_ptr<uint8_t>();
  for (int64_t i = 0; i < widths.numel(); ++i) bits += w[i];
  const int64_t code_bytes = codes.size(2), groups = scales.size(2), capacity = codes.size(0) * codes.size(1);
  TORCH_CHECK((bits + 7) / 8 == code_bytes, "coded_write: ", bits, " bits a token, the cache holds ", code_bytes, " bytes");
  // rope.apply_rope on k_r, then coded.encode: each side less its mean (the rope key's turned), in the model dtype
  k_r = rotate(k_r.to(at::kFloat), cos, sin, code.interleaved).to(c.scalar_type());
  if (code.latent_mean.defined()) {
    c = c.sub(code.latent_mean.to(c.scalar_type()));
    k_r = k_r.sub(rotate(code.rope_mean, cos, sin, code.interleaved).to(k_r.scalar_type()));
  }
  auto [lc, ls] = encode_side(c, code.latent_side);
  auto [rc, rs] = encode_side(k_r, code.rope_side);
  const at::Tensor values = at::cat({lc, rc}, 1).contiguous(), scale = at::cat({ls, rs}, 1).contiguous();
  TORCH_CHECK(values.size(1) == widths.numel() && scale.size(1) == groups, "coded_write: ", values.size(1), " values and ",
              scale.size(1), " scales a token; the code packs ", widths.numel(), ", the cache holds ", groups);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t n = values.size(1);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(0 <= slot[t] && slot[t] < capacity, "coded_write: slot ", slot[t], " outside the cache's ", capacity);
    uint8_t* dst = codes.data_ptr<uint8_t>() + slot[t] * code_bytes;
    std::memset(dst, 0, code_bytes);
    const uint8_t* v = values.data_ptr<uint8_t>() + t * n;
    for (int64_t i = 0, at = 0; i < n; at += w[i], ++i) {  // a value of b <= 8 bits spans two bytes at most
      const uint32_t shifted = (uint32_t)v[i] << (at & 7);
      dst[at >> 3] |= (uint8_t)shifted;
      if (shifted >> 8) dst[(at >> 3) + 1] |= (uint8_t)(shifted >> 8);
    }
    std::memcpy(scales.data_ptr<at::Half>() + slot[t] * groups, scale.data_ptr<at::Half>() + t * groups, groups * 2);
  }
}

// coded_latent_attention for one decode token a row: query [B, H, r + dr] (absorbed, scaled) -> o_lat
// [B, H, r] in the query's dtype: the query turned into the code's row (float32, then its dtype), the kernel
// over the layer's codes and scales with cs [positions, width] float32, its output turned back (+ the
// latent's mean) in float32; the maps through `linear` (qlinear's) where the code holds them packed.
at::Tensor coded_decode(CodedDecodeFn kernel, LinearFn linear, int64_t caps_linear, const at::Tensor& query,
                        const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& cs,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t heads,
                        int64_t block_size, const PlanCoded& code, int64_t caps, int64_t threads) {
  const int64_t B = query.size(0), rows = query.size(1), width = query.size(2);
  at::Tensor turned = map_rows(query.reshape({-1, width}).to(at::kFloat), code.query_map, code.query_packed, linear,
                               caps_linear).view({B, rows, -1});
  at::Tensor out = kernel(turned.to(query.scalar_type()), codes, scales, code.runs, code.steps, cs, code.latent_columns,
                          block_tables, context_lens, context_lens.new_empty(0), heads, block_size, caps, threads);
  at::Tensor o_lat = map_rows(out.view({B * rows, -1}).to(at::kFloat), code.out_map, code.out_packed, linear, caps_linear);
  if (code.latent_mean.defined()) o_lat.add_(code.latent_mean);
  return o_lat.view({B, rows, -1}).to(query.scalar_type());
}
