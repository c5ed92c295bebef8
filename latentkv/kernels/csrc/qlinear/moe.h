// A DeepSeek MoE layer's routed and shared experts in one call (kernels/qlinear.py `moe`; model/deepseek.py
// MoE runs it where its experts' linears run this extension's packed kernel). At file scope in qlinear.cpp,
// after qlinear_kernel.h (the kernels as work units) and common/swiglu.h (silu_mul):
//   moe(x [T, D], weights [T, k] float32, ids [T, k] int64, gate_up [E, NB, G, REC], down [E, NB', G', REC],
//       shared_gate_up [NB, G, REC], shared_down (both empty: no shared experts), kind, inter, shared_inter, caps)
//   -> [T, D] in x's dtype.
// gate_up[e], down[e]: routed expert e's packed gate_up (2 inter outputs, gate then up) and down (D outputs),
// records of `kind` (4, 8, 16, 32, 104, 108: qlinear_kernel.h). Per token t it computes
//   y_s = down_e(silu_mul(gate_up_e(x_t))) for each slot s, e = ids[t, s]: expert e's MLP with the bits of
//         its modules (each linear's output in x's dtype, SwiGLU as decode_ops' silu_mul),
//   acc = 0; acc = acc + weights[t, s] * y_s for s = 0 .. k-1 in order; acc = acc + shared(x_t),
//   out_t = acc in x's dtype,
// acc float32, each product and sum rounded once (model/deepseek.py moe_reference: the same steps).
// How: the (token, slot) rows grouped by expert (a counting sort; tokens in order within a group; the
// shared experts are one more group, of every token); x prepared once per token for the kernel (for the
// integer-dot kinds: quantized) and its rows gathered into the groups; the gate_up of every group in one
// parallel region whose items are (group, work units), each taken by the next free thread (batch 1: six
// experts' units spread over all threads; batch 32: the groups), on AMX with the SwiGLU in its last step
// (elsewhere SwiGLU and the down projection's activations over all rows at once); down like gate_up; then
// each token's sum. An expert without tokens
// costs nothing. Every output element reduces in a fixed order whatever the batch, the groups or the
// threads: batch-invariant.
#pragma once
#include "torch_lite.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// One linear over some rows: rows m0 .. m0 + M of `act` times `packed` (G groups a row, N outputs)
// -> out [M, N] (of the kernel's out_type), in `units` work units.
struct Job {
  const int32_t* packed;
  int64_t G, N;
  const Act* act;
  int64_t m0, M;
  void* out;
  int64_t units;
  bool swiglu = false;  // a [gate; up] weight of 2N rows: out [M, N] bf16 = silu(gate) * up (AMX)
};

// Every job's work units as the items of one parallel region, each item taken by the next free thread
// (jobs differ in cost: a shared expert's rows against a routed one's few). An item is a run of a
// job's units: about two per thread, so that the tile path keeps an activation block in L2 across a
// run. What an item computes does not depend on which thread takes it, nor on how units were cut.
void run_jobs(const Kernel& kernel, const std::vector<Job>& jobs) {
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> first(1, 0), per;  // first[j]: job j's first item; per[j]: units per item
  for (const Job& job : jobs) {
    per.push_back(std::max<int64_t>(1, (job.units + 2 * threads - 1) / (2 * threads)));
    first.push_back(first.back() + (job.units + per.back() - 1) / per.back());
  }
  const int64_t items = first.back();
  if (items == 0) return;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(items, threads), 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < items; i = next++) {
      const size_t j = std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1;
      const Job& job = jobs[j];
      const int64_t u0 = (i - first[j]) * per[j], u1 = std::min(job.units, u0 + per[j]);
      if (job.swiglu) kernel.run_swiglu(job.packed, job.G, *job.act, job.m0, job.M, static_cast<uint16_t*>(job.out), job.N, u0, u1);
      else kernel.run(job.packed, job.G, *job.act, job.m0, job.M, job.out, job.N, job.N, u0, u1);
    }
  });
}

// Rows src[r] of t (-1: a zero row) -> [src.size(), t's columns] (t: rows of unit column stride).
at::Tensor gather_rows(const at::Tensor& t, const std::vector<int64_t>& src) {
  if (!t.defined()) return t;
  const int64_t R = (int64_t)src.size(), bytes = t.size(1) * t.element_size(), ld = t.stride(0) * t.element_size();
  at::Tensor out = at::empty({R, t.size(1)}, t.options());
  const char* s = static_cast<const char*>(t.data_ptr());
  char* d = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, R, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (src[r] < 0) std::memset(d + r * bytes, 0, bytes);
      else std::memcpy(d + r * bytes, s + src[r] * ld, bytes);
    }
  });
  return out;
}

Act gather(const Act& a, const std::vector<int64_t>& src) {
  Act g;
  g.rows = gather_rows(a.rows, src), g.sums = gather_rows(a.sums, src), g.sx = gather_rows(a.sx, src);
  g.qsum = gather_rows(a.qsum, src);
  return g;
}

// o = o + w * y over D elements, float32, the product and the sum each rounded once, as PyTorch's mul then
// add (the moe reference): fp-contract off, so that no build flag fuses them into an fma.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
void add_weighted(float* __restrict o, const float* __restrict y, float w, int64_t D) {
  for (int64_t i = 0; i < D; ++i) o[i] = o[i] + w * y[i];
}
void add_weighted(float* __restrict o, const at::BFloat16* __restrict y, float w, int64_t D) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(y);
  for (int64_t i = 0; i < D; ++i) o[i] = o[i] + w * __builtin_bit_cast(float, (uint32_t)bits[i] << 16);
}
#pragma GCC pop_options

// out [T, D] = per token t: sum over slots s of weights[t, s] * y[row[t, s]], then + shared[t] (when given),
// in that order (float32) -> x's dtype. y, shared: float32 or bf16 rows [*, D].
template <typename Y>
at::Tensor weighted_sum(const at::Tensor& y, const at::Tensor& shared, const at::Tensor& weights,
                        const std::vector<int64_t>& row, at::ScalarType dtype) {
  const int64_t T = weights.size(0), k = weights.size(1), D = y.size(1);
  at::Tensor acc = at::empty({T, D}, weights.options());
  const Y* yp = y.data_ptr<Y>();
  const Y* sp = shared.defined() ? shared.data_ptr<Y>() : nullptr;
  const float* w = weights.data_ptr<float>();
  float* ap = acc.data_ptr<float>();
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D * (k + 1))), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = ap + t * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t s = 0; s < k; ++s) add_weighted(o, yp + row[t * k + s] * D, w[t * k + s], D);
      if (sp) add_weighted(o, sp + t * D, 1.0f, D);  // 1 * y is y: the shared experts' output added as it is
    }
  });
  return dtype == at::kFloat ? acc : acc.to(dtype);
}

void check_experts(const at::Tensor& t, int64_t dim, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == dim && t.scalar_type() == at::kInt && t.is_contiguous(), "qlinear moe: ",
              what, " must be a contiguous int32 CPU tensor of ", dim, " dimensions (packed records)");
}

}  // namespace

at::Tensor moe(at::Tensor x, at::Tensor weights, at::Tensor ids, at::Tensor gate_up, at::Tensor down,
               at::Tensor shared_gate_up, at::Tensor shared_down, int64_t kind, int64_t inter, int64_t shared_inter,
               int64_t caps) {
  check_caps(caps, "qlinear moe");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "qlinear moe: x must be a [T, D] float32 or bfloat16 CPU tensor");
  const int64_t T = x.size(0), D = x.size(1);
  TORCH_CHECK(ids.device().is_cpu() && ids.dim() == 2 && ids.size(0) == T && ids.scalar_type() == at::kLong,
              "qlinear moe: ids must be [T, k] int64 (the router's expert numbers), T = ", T);
  TORCH_CHECK(weights.device().is_cpu() && weights.sizes() == ids.sizes() && weights.scalar_type() == at::kFloat,
              "qlinear moe: weights must be [T, k] float32 like ids");
  check_experts(gate_up, 4, "gate_up"), check_experts(down, 4, "down");
  const int64_t E = gate_up.size(0), k = ids.size(1);
  TORCH_CHECK(down.size(0) == E, "qlinear moe: gate_up holds ", E, " experts, down ", down.size(0));
  const Kernel kernel(kind, caps, x.scalar_type() == at::kBFloat16);
  check_fit(gate_up.size(1), gate_up.size(2), gate_up.size(3), kernel.rec(), kernel.group(), D, 2 * inter, "moe gate_up");
  check_fit(down.size(1), down.size(2), down.size(3), kernel.rec(), kernel.group(), inter, D, "moe down");
  const bool shared = shared_gate_up.numel() > 0;
  if (shared) {
    check_experts(shared_gate_up, 3, "shared_gate_up"), check_experts(shared_down, 3, "shared_down");
    check_fit(shared_gate_up.size(0), shared_gate_up.size(1), shared_gate_up.size(2), kernel.rec(), kernel.group(), D, 2 * shared_inter,
              "moe shared_gate_up");
    check_fit(shared_down.size(0), shared_down.size(1), shared_down.size(2), kernel.rec(), kernel.group(), shared_inter, D,
              "moe shared_down");
  }
  if (T == 0) return at::empty({0, D}, x.options());
  ids = ids.contiguous(), weights = weights.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  // the groups: (token, slot) pairs sorted by expert (a counting sort), tokens in order within one;
  // AMX reads a group's rows in whole 16-row tiles, so its groups start at multiples of 16
  const int64_t align = kernel.amx() ? 16 : 1;
  std::vector<int64_t> count(E, 0), start(E, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < E, "qlinear moe: ids[", i / k, ", ", i % k, "] = ", id[i], " is not one of the ",
                E, " experts");
    ++count[id[i]];
  }
  int64_t R = 0;
  for (int64_t e = 0; e < E; ++e) start[e] = R, R += (count[e] + align - 1) / align * align;
  std::vector<int64_t> src(R, -1), row(T * k), fill(start);  // src: a group row's token; row: a slot's group row
  for (int64_t i = 0; i < T * k; ++i) row[i] = fill[id[i]]++, src[row[i]] = i / k;

  const at::ScalarType out_type = kernel.out_type(), dtype = x.scalar_type();
  const int64_t esize = out_type == at::kFloat ? 4 : 2;
  const auto at_row = [&](const at::Tensor& t, int64_t r) { return static_cast<char*>(t.data_ptr()) + r * t.size(1) * esize; };
  // AMX writes no padding row: zeros there, so that what its tiles read and write there is defined
  const auto new_rows = [&](int64_t cols) {
    at::Tensor t = at::empty({R, cols}, x.options().dtype(out_type));
    for (int64_t e = 0; e < E; ++e)
      if (count[e] % align) std::memset(at_row(t, start[e] + count[e]), 0, (align - count[e] % align) * cols * esize);
    return t;
  };
  std::vector<Job> jobs;
  // gate_up: x prepared once per token, its rows gathered into the groups (the shared group reads them as they are)
  const Act xt = kernel.prepare(x, gate_up.size(2), false);
  const Act xg = gather(xt, src);
  // On AMX the SwiGLU runs in gate_up's last step (swiglu_linear's bits: the linear's bf16 output, then
  // silu_mul) and down reads its output in place; elsewhere gate_up's output, then silu_mul, then down's
  // activations from it. Either way: each linear's output in x's dtype, SwiGLU as decode_ops' silu_mul.
  const bool fused = kernel.amx() && inter % 16 == 0 && (!shared || shared_inter % 16 == 0);
  at::Tensor h = new_rows(fused ? inter : 2 * inter), hs;
  if (shared) {
    hs = at::empty({T, fused ? shared_inter : 2 * shared_inter}, x.options().dtype(out_type));
    jobs.push_back({shared_gate_up.data_ptr<int32_t>(), shared_gate_up.size(1), fused ? shared_inter : 2 * shared_inter, &xt,
                    0, T, hs.data_ptr(), fused ? isa_amx::unit_count(shared_inter, true) : kernel.units(T, 2 * shared_inter),
                    fused});
  }
  for (int64_t e = 0; e < E; ++e)
    if (count[e])
      jobs.push_back({gate_up.data_ptr<int32_t>() + e * gate_up.stride(0), gate_up.size(2), fused ? inter : 2 * inter, &xg,
                      start[e], count[e], at_row(h, start[e]),
                      fused ? isa_amx::unit_count(inter, true) : kernel.units(count[e], 2 * inter), fused});
  run_jobs(kernel, jobs);
  const Act ag = fused ? kernel.prepare(h, down.size(2), true) : kernel.prepare(silu_mul(h.to(dtype), caps), down.size(2), false);
  const Act as = !shared ? Act()
                 : fused ? kernel.prepare(hs, shared_down.size(1), true)
                         : kernel.prepare(silu_mul(hs.to(dtype), caps), shared_down.size(1), false);
  at::Tensor y = new_rows(D), ys;
  jobs.clear();
  if (shared) {
    ys = at::empty({T, D}, x.options().dtype(out_type));
    jobs.push_back({shared_down.data_ptr<int32_t>(), shared_down.size(1), D, &as, 0, T, ys.data_ptr(), kernel.units(T, D)});
  }
  for (int64_t e = 0; e < E; ++e)
    if (count[e])
      jobs.push_back({down.data_ptr<int32_t>() + e * down.stride(0), down.size(2), D, &ag, start[e], count[e],
                      at_row(y, start[e]), kernel.units(count[e], D)});
  run_jobs(kernel, jobs);
  // the weighted sum per token, of the experts' outputs in x's dtype (as the modules return them)
  y = y.to(dtype), ys = shared ? ys.to(dtype) : ys;
  if (dtype == at::kFloat) return weighted_sum<float>(y, ys, weights, row, dtype);
  return weighted_sum<at::BFloat16>(y, ys, weights, row, dtype);
}
