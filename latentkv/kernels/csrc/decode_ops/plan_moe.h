// A MoE layer in the decode plan (decode_step.h): the router as model/deepseek.py Gate.forward runs it (its
// logits, then qlinear's `moe_route`), then the experts in qlinear's `moe` (through their capsules, as
// Gate.forward and MoE.forward call them).
#pragma once
#include "kernel_fns.h"
#include "torch_lite.h"

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>

#include <cstdint>
#include <utility>

struct PlanMoe {
  bool defined = false;
  // Gate: weight [E, D] float32 (gate_packed: in qlinear's float32 record, as Gate.logits runs it; undefined:
  // the padded sgemm), e_score_correction_bias [E] (undefined: none) and its choices
  at::Tensor gate, gate_packed, bias;
  bool softmax = true, group_limited = false, noaux = false, normalized = false;
  int64_t n_group = 1, topk_group = 1, k = 1, safe_rows = 0;
  double scale = 1;
  // the experts, as MoE.native holds them (shared ones: empty tensors when there are none)
  at::Tensor gate_up, down, shared_gate_up, shared_down;
  int64_t kind = 0, inter = 0, shared_inter = 0;
};

static PlanMoe plan_moe(const py::dict& d) {
  PlanMoe p;
  if (!d.contains("moe") || d["moe"].is_none()) return p;
  py::dict m = d["moe"].cast<py::dict>();
  p.defined = true;
  p.gate = m["gate"].cast<at::Tensor>();
  if (!m["gate_packed"].is_none()) p.gate_packed = m["gate_packed"].cast<at::Tensor>();
  if (!m["bias"].is_none()) p.bias = m["bias"].cast<at::Tensor>();
  p.softmax = m["softmax"].cast<bool>(), p.group_limited = m["group_limited"].cast<bool>();
  p.noaux = m["noaux"].cast<bool>(), p.normalized = m["normalized"].cast<bool>();
  p.n_group = m["n_group"].cast<int64_t>(), p.topk_group = m["topk_group"].cast<int64_t>(), p.k = m["k"].cast<int64_t>();
  p.safe_rows = m["safe_rows"].cast<int64_t>(), p.scale = m["scale"].cast<double>();
  py::tuple n = m["native"].cast<py::tuple>();  // MoE.native: gate_up, down, shared_gate_up, shared_down, kind, inter, shared_inter
  p.gate_up = n[0].cast<at::Tensor>(), p.down = n[1].cast<at::Tensor>();
  p.shared_gate_up = n[2].is_none() ? p.gate_up.new_empty(0) : n[2].cast<at::Tensor>();
  p.shared_down = n[3].is_none() ? p.gate_up.new_empty(0) : n[3].cast<at::Tensor>();
  p.kind = n[4].cast<int64_t>(), p.inter = n[5].cast<int64_t>(), p.shared_inter = n[6].cast<int64_t>();
  return p;
}

// Gate.logits: x [T, D] -> [T, E] float32, through `linear` (qlinear's, isa `isa_linear`) where the gate is packed.
static at::Tensor gate_logits(const PlanMoe& p, const at::Tensor& xf, LinearFn linear, int64_t isa_linear) {
  if (p.gate_packed.defined()) return linear(xf.contiguous(), p.gate_packed, 32, p.gate.size(0), isa_linear);
  // invariant.linear: float32 rows padded with zero rows to invariant.padded_rows (a multiple of 4 below SAFE_ROWS)
  const int64_t M = xf.size(0), Mp = M >= p.safe_rows || M % 4 == 0 ? M : (M + 3) / 4 * 4;
  return Mp == M ? at::linear(xf, p.gate) : at::linear(at::constant_pad_nd(xf, {0, 0, 0, Mp - M}), p.gate).slice(0, 0, M);
}

// Gate.forward: x [T, D] -> (weights [T, k] float32, ids [T, k]): its logits, then qlinear's moe_route (the
// router's one implementation, which Gate.forward calls too).
static std::pair<at::Tensor, at::Tensor> route_tokens(const PlanMoe& p, const at::Tensor& x, LinearFn linear, RouteFn route,
                                                      int64_t isa_linear) {
  const at::Tensor logits = gate_logits(p, x.to(at::kFloat), linear, isa_linear);
  auto [weights, ids] = route(logits, p.bias.defined() ? p.bias : logits.new_empty(0), p.softmax, p.n_group, p.topk_group,
                              p.noaux, p.group_limited, p.k, p.normalized, p.scale);
  return {weights, ids};
}
