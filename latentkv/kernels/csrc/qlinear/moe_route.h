// A MoE layer's router after its logits, for the whole batch in one native pass (kernels/qlinear.py
// `moe_route`; model/deepseek.py Gate.forward and the decode plan's MoE layers call it, so the route has
// one implementation). At file scope in qlinear.cpp:
//   moe_route(logits [T, E] float32, bias [E] float32 (empty: none), softmax, n_group, topk_group,
//             noaux, group_limited, k, normalized, scale) -> (weights [T, k] float32, ids [T, k] int64)
// Per token: scores = softmax(logits) (V2) or sigmoid(logits) (V3); choice = scores + bias; with
// group_limited, the experts of all but the best topk_group groups (a group scores by its two best
// choices with noaux, V3, else by its best, V2) are set to -inf (noaux) or 0 (V2, as DeepSeek's
// group_limited_greedy); ids = the k best choices (descending, ties: the lower expert first);
// weights = scores[ids], divided by their sum + 1e-20 where normalized, times scale. A token's row
// depends on its own logits only (rows in parallel, each alone): batch-invariant.
#pragma once
#include "torch_lite.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

// The indices of the n largest of v[0..E) (descending, ties: the lower index first) into out[0..n).
void top_n(const float* v, int64_t E, int64_t n, int64_t* out) {
  int64_t filled = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (filled == n && !(v[e] > v[out[n - 1]])) continue;
    int64_t at = filled < n ? filled++ : n - 1;
    while (at > 0 && v[out[at - 1]] < v[e]) out[at] = out[at - 1], --at;
    out[at] = e;
  }
}

void route_row(const float* logit, const float* bias, int64_t E, bool softmax, int64_t n_group, int64_t topk_group,
               bool noaux, bool group_limited, int64_t k, bool normalized, float scale, float* w, int64_t* id,
               float* scores, float* choice) {
  if (softmax) {
    float m = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, logit[e]);
    for (int64_t e = 0; e < E; ++e) sum += scores[e] = std::exp(logit[e] - m);
    for (int64_t e = 0; e < E; ++e) scores[e] /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logit[e]));
  }
  for (int64_t e = 0; e < E; ++e) choice[e] = bias ? scores[e] + bias[e] : scores[e];
  if (group_limited && n_group > 1) {
    const int64_t per = E / n_group;
    float group_score[256];  // n_group <= 256 (checked by the entry)
    for (int64_t g = 0; g < n_group; ++g) {
      const float* c = choice + g * per;
      if (noaux) {
        int64_t two[2];
        top_n(c, per, std::min<int64_t>(2, per), two);
        group_score[g] = per > 1 ? c[two[0]] + c[two[1]] : c[two[0]];
      } else {
        group_score[g] = *std::max_element(c, c + per);
      }
    }
    int64_t keep[256];
    top_n(group_score, n_group, topk_group, keep);
    const float fill = noaux ? -std::numeric_limits<float>::infinity() : 0.0f;
    for (int64_t g = 0; g < n_group; ++g)
      if (std::find(keep, keep + topk_group, g) == keep + topk_group) std::fill(choice + g * per, choice + (g + 1) * per, fill);
  }
  top_n(choice, E, k, id);
  float sum = 0.0f;
  for (int64_t s = 0; s < k; ++s) sum += w[s] = scores[id[s]];
  for (int64_t s = 0; s < k; ++s) w[s] = (normalized ? w[s] / (sum + 1e-20f) : w[s]) * scale;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_route(at::Tensor logits, at::Tensor bias, bool softmax, int64_t n_group,
                                             int64_t topk_group, bool noaux, bool group_limited, int64_t k,
                                             bool normalized, double scale) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "qlinear moe_route: logits must be a [T, E] float32 CPU tensor");
  logits = logits.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1);
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.scalar_type() == at::kFloat && bias.numel() == E && bias.is_contiguous()),
              "qlinear moe_route: bias must be empty or E = ", E, " contiguous float32 values");
  TORCH_CHECK(k >= 1 && k <= E, "qlinear moe_route: k must be in [1, ", E, "], got ", k);
  TORCH_CHECK(!group_limited || (n_group >= 1 && n_group <= 256 && E % n_group == 0 && topk_group >= 1 &&
                                 topk_group <= n_group && k <= topk_group * (E / n_group)),
              "qlinear moe_route: groups must divide the experts (n_group ", n_group, ", topk_group ", topk_group,
              ", E ", E, ") and hold k");
  at::Tensor weights = at::empty({T, k}, logits.options()), ids = at::empty({T, k}, logits.options().dtype(at::kLong));
  const float* lp = logits.data_ptr<float>();
  const float* bp = has_bias ? bias.data_ptr<float>() : nullptr;
  float* wp = weights.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(E), choice(E);
    for (int64_t t = begin; t < end; ++t)
      route_row(lp + t * E, bp, E, softmax, n_group, topk_group, noaux, group_limited, k, normalized, (float)scale,
                wp + t * k, ip + t * k, scores.data(), choice.data());
  });
  return {weights, ids};
}
