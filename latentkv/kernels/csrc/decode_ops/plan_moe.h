// A MoE layer in the decode plan (decode_step.cpp; its inputs: plan_layer.h PlanMoe): the router as model/deepseek.py Gate.forward runs it (its
// logits, then qlinear's `moe_route`), then the experts in qlinear's `moe` (through their capsules, as
// Gate.forward and MoE.forward call them).
#pragma once
#include "kernel_fns.h"
#include "plan_layer.h"
#include "torch_lite.h"

#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>

#include <cstdint>
#include <utility>

// Gate.logits: x [T, D] -> [T, E] float32, through `linear` (qlinear's, under `caps_linear`) where the gate is packed.
static at::Tensor gate_logits(const PlanMoe& p, const at::Tensor& xf, LinearFn linear, int64_t caps_linear) {
  if (p.gate_packed.defined()) return linear(xf.contiguous(), p.gate_packed, 32, p.gate.size(0), caps_linear);
  // invariant.linear: float32 rows padded with zero rows to invariant.padded_rows (a multiple of 4 below SAFE_ROWS)
  const int64_t M = xf.size(0), Mp = M >= p.safe_rows || M % 4 == 0 ? M : (M + 3) / 4 * 4;
  return Mp == M ? at::linear(xf, p.gate) : at::linear(at::constant_pad_nd(xf, {0, 0, 0, Mp - M}), p.gate).slice(0, 0, M);
}

// Gate.forward: x [T, D] -> (weights [T, k] float32, ids [T, k]): its logits, then qlinear's moe_route (the
// router's one implementation, which Gate.forward calls too).
static std::pair<at::Tensor, at::Tensor> route_tokens(const PlanMoe& p, const at::Tensor& x, LinearFn linear, RouteFn route,
                                                      int64_t caps_linear) {
  const at::Tensor logits = gate_logits(p, x.to(at::kFloat), linear, caps_linear);
  auto [weights, ids] = route(logits, p.bias.defined() ? p.bias : logits.new_empty(0), p.softmax, p.n_group, p.topk_group,
                              p.noaux, p.group_limited, p.k, p.normalized, p.scale);
  return {weights, ids};
}
