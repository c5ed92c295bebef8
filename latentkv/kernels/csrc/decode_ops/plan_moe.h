// A MoE layer in the decode plan (decode_step.h): the router as model/deepseek.py Gate.forward runs it,
// the same ATen ops with the same arguments in the same order (so the same bits), then the experts in
// qlinear's `moe` (through its capsule, as MoE.forward calls it).
#pragma once
#include "kernel_fns.h"
#include "torch_lite.h"

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/zeros_like.h>

#include <cstdint>
#include <limits>
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

// Gate.limit_groups: keep the experts of the best topk_group groups.
static at::Tensor limit_groups(const PlanMoe& p, const at::Tensor& choice) {
  const at::Tensor grouped = choice.view({choice.size(0), p.n_group, -1});
  at::Tensor group_scores;
  double fill;
  if (p.noaux) {  // V3: a group scores by its two best experts
    group_scores = std::get<0>(grouped.topk(2, -1)).sum({-1});
    fill = -std::numeric_limits<double>::infinity();
  } else {  // V2 group_limited_greedy: by its best expert
    group_scores = grouped.amax({-1});
    fill = 0.0;
  }
  at::Tensor keep = at::zeros_like(group_scores, group_scores.options().dtype(at::kBool));
  keep.scatter_(1, std::get<1>(group_scores.topk(p.topk_group, -1)), true);
  return grouped.masked_fill(keep.unsqueeze(-1).bitwise_not(), fill).view_as(choice);
}

// Gate.logits: x [T, D] -> [T, E] float32, through `linear` (qlinear's, isa `isa_linear`) where the gate is packed.
static at::Tensor gate_logits(const PlanMoe& p, const at::Tensor& xf, LinearFn linear, int64_t isa_linear) {
  if (p.gate_packed.defined()) return linear(xf.contiguous(), p.gate_packed, 32, p.gate.size(0), isa_linear);
  // invariant.linear: float32 rows padded with zero rows to invariant.padded_rows (a multiple of 4 below SAFE_ROWS)
  const int64_t M = xf.size(0), Mp = M >= p.safe_rows || M % 4 == 0 ? M : (M + 3) / 4 * 4;
  return Mp == M ? at::linear(xf, p.gate) : at::linear(at::constant_pad_nd(xf, {0, 0, 0, Mp - M}), p.gate).slice(0, 0, M);
}

// Gate.forward: x [T, D] -> (weights [T, k] float32, ids [T, k]). (Its operators +, /, * as the methods
// add, div, mul: the same ATen ops.)
static std::pair<at::Tensor, at::Tensor> route_tokens(const PlanMoe& p, const at::Tensor& x, LinearFn linear,
                                                      int64_t isa_linear) {
  const at::Tensor logits = gate_logits(p, x.to(at::kFloat), linear, isa_linear);
  const at::Tensor scores = p.softmax ? logits.softmax(-1) : logits.sigmoid();
  at::Tensor choice = p.bias.defined() ? scores.add(p.bias) : scores;
  if (p.group_limited) choice = limit_groups(p, choice);
  const at::Tensor ids = std::get<1>(choice.topk(p.k, -1));
  at::Tensor weights = scores.gather(1, ids);
  if (p.normalized) weights = weights.div(weights.sum({-1}, true).add(1e-20));
  return {weights.mul(p.scale), ids};
}
