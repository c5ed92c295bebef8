// SwiGLU's silu(gate) * up as one call, for every extension that runs it (decode_ops' `silu_mul`, the
// MoE op in qlinear), over the rows `silu_rows(caps)` gives: each extension defines it from its paths,
// each of which compiled swiglu_rows.h, so the two extensions give the same bits on the same path.
//   silu_mul(gate_up [T, 2I] float32 / bf16, caps) -> silu(gate) * up [T, I] in gate_up's dtype.
// Rows split with at::parallel_for.
#pragma once
#include "isa_paths.h"
#include "swiglu_fns.h"
#include "torch_lite.h"

#include <algorithm>
#include <cstdint>

SiluRows silu_rows(int64_t caps);  // the extension's: the best of its paths caps allows

at::Tensor silu_mul(at::Tensor gate_up, int64_t caps) {
  TORCH_CHECK(gate_up.device().is_cpu(), "silu_mul: gate_up must be on the CPU");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 &&
                  (gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16),
              "silu_mul: gate_up must be [T, 2I] float");
  check_caps(caps, "silu_mul");
  gate_up = gate_up.contiguous();
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::empty({T, I}, gate_up.options());
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, I));  // rows per task: ~16K elements
  if (gate_up.scalar_type() == at::kBFloat16) {
    const auto rows = silu_rows(caps).bf16;
    const uint16_t* gp = (const uint16_t*)gate_up.data_ptr();
    uint16_t* op = (uint16_t*)out.data_ptr();
    at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end) { rows(gp, op, begin, end, I); });
  } else {
    const auto rows = silu_rows(caps).f32;
    const float* gp = gate_up.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end) { rows(gp, op, begin, end, I); });
  }
  return out;
}
