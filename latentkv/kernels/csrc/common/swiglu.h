// SwiGLU's silu(gate) * up as one call, for every extension that runs it (decode_ops' `silu_mul`, the
// MoE op in qlinear): included at file scope after the extension's ISA namespaces (isa_avx512,
// isa_avx2, isa_scalar), each of which included swiglu_rows.h, so the two extensions give the same
// bits on the same ISA.
//   silu_mul(gate_up [T, 2I] float32 / bf16, caps) -> silu(gate) * up [T, I] in gate_up's dtype.
// caps (cpu_isa.h): the avx512 rows where they include avx2 and avx512, else the avx2 rows where they
// include avx2, else the scalar rows. Rows split with at::parallel_for.
#pragma once
#include "isa_paths.h"
#include "torch_lite.h"

#include <algorithm>
#include <cstdint>

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
    using Rows = void (*)(const uint16_t*, uint16_t*, int64_t, int64_t, int64_t);
    Rows rows = has(caps, CAP_AVX2 | CAP_AVX512) ? static_cast<Rows>(isa_avx512::silu_mul_rows)
              : has(caps, CAP_AVX2) ? static_cast<Rows>(isa_avx2::silu_mul_rows) : static_cast<Rows>(isa_scalar::silu_mul_rows);
    const uint16_t* gp = (const uint16_t*)gate_up.data_ptr();
    uint16_t* op = (uint16_t*)out.data_ptr();
    at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end) { rows(gp, op, begin, end, I); });
  } else {
    using Rows = void (*)(const float*, float*, int64_t, int64_t, int64_t);
    Rows rows = has(caps, CAP_AVX2 | CAP_AVX512) ? static_cast<Rows>(isa_avx512::silu_mul_rows)
              : has(caps, CAP_AVX2) ? static_cast<Rows>(isa_avx2::silu_mul_rows) : static_cast<Rows>(isa_scalar::silu_mul_rows);
    const float* gp = gate_up.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end) { rows(gp, op, begin, end, I); });
  }
  return out;
}
