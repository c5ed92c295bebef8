// A whole decode step's decoder layers in one call (model/decode_plan.py builds the plan): the
// same kernels, with the same arguments, in the same order as the PyTorch modules call them
// (model/deepseek.py DecoderLayer, model/mla.py MLAttention on the absorbed path, model/quant.py
// linears, kernels/attention.py mla_decode), so the result is bit-identical to the module path;
// what goes is the Python between them (~40% of a batch-1 step at short context on 2 threads:
// module calls, views, checks). Its ops (rms_norm, rope, write_latent, head_matmul, silu_mul) are
// declared in decode_ops.h and defined in decode_ops.cpp; the weight linears, a MoE layer's experts
// and the attention kernel live in the other two extensions and come in as function pointers
// (PyCapsules their modules export, of the types in common/kernel_fns.h, checked when the plan is
// built); a MoE layer's router runs as its module does (plan_moe.h).
//
// Applies to steps whose rows are all single-token decodes of distinct sequences (row b =
// sequence b), linears that run latentkv's packed kernel (a MoE layer's experts its native call);
// the Python side checks.
#pragma once
#include "decode_ops.h"
#include "kernel_fns.h"
#include "plan_moe.h"
#include "torch_lite.h"

#include <ATen/ops/add.h>  // a linear's bias
#include <ATen/ops/index_select.h>  // a folded query's rope slots

#include <cstdint>
#include <vector>

struct PlanLinear {
  at::Tensor packed, bias;  // bias undefined when there is none
  int64_t kind = 0, out = 0;
};

struct PlanLayer {
  at::Tensor w_in, w_post, w_q_a_norm, w_kv_a_norm, w_uk, w_uv_t;  // norms undefined when absent
  at::Tensor uk_packed, uv_packed;  // head_pack(w_uk), head_pack(w_uv_t): empty off AMX
  at::Tensor rope_slots, mix, mix_packed;  // a folded query projection (model/rope_groups.py): undefined without
  double eps_in = 0, eps_post = 0, eps_latent = 0;
  PlanLinear qkv_a, q_b, o, gate_up, down;  // q_b.out == 0 without q_lora; gate_up, down: dense layers
  PlanMoe moe;  // MoE layers (moe.defined)
  int64_t q_dim = 0, heads = 0, dn = 0, dr = 0, dv = 0, rank = 0;
  double scale = 1;
  bool interleaved = true;
  at::Tensor kv, latent, cache_scale, cache_rope;  // the layer's cache: kv, or latent + scale + rope
  double qmax = 0;
  int64_t block_size = 0;
};

template <typename T>
static T item(const py::dict& d, const char* key) {
  return d[key].cast<T>();
}

static at::Tensor optional_tensor(const py::dict& d, const char* key) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<at::Tensor>() : at::Tensor();
}

static PlanLinear plan_linear(const py::dict& d, const char* key) {
  PlanLinear p;
  if (!d.contains(key) || d[key].is_none()) return p;
  py::tuple t = d[key].cast<py::tuple>();  // (packed, kind, out_features, bias or None)
  p.packed = t[0].cast<at::Tensor>(), p.kind = t[1].cast<int64_t>(), p.out = t[2].cast<int64_t>();
  if (!t[3].is_none()) p.bias = t[3].cast<at::Tensor>();
  return p;
}

class DecodePlan {
 public:
  DecodePlan(py::list layers, at::Tensor w_norm, double eps_norm, py::capsule linear_fn, py::capsule moe_fn,
             py::capsule route_fn, py::capsule decode_fn, int64_t isa_ops, int64_t isa_linear, int64_t isa_attention)
      : w_norm_(w_norm), eps_norm_(eps_norm), linear_(import_fn<LinearFn>(linear_fn, "qlinear's linear")),
        moe_(import_fn<MoeFn>(moe_fn, "qlinear's moe")), route_(import_fn<RouteFn>(route_fn, "qlinear's moe_route")),
        decode_(import_fn<DecodeFn>(decode_fn, "attention's mla_decode")),
        isa_ops_(isa_ops), isa_linear_(isa_linear), isa_attention_(isa_attention) {
    for (py::handle h : layers) {
      py::dict d = py::reinterpret_borrow<py::dict>(h);
      PlanLayer l;
      l.w_in = item<at::Tensor>(d, "w_in"), l.w_post = item<at::Tensor>(d, "w_post");
      l.eps_in = item<double>(d, "eps_in"), l.eps_post = item<double>(d, "eps_post");
      l.eps_latent = item<double>(d, "eps_latent");
      l.w_q_a_norm = optional_tensor(d, "w_q_a_norm"), l.w_kv_a_norm = optional_tensor(d, "w_kv_a_norm");
      l.w_uk = item<at::Tensor>(d, "w_uk"), l.w_uv_t = item<at::Tensor>(d, "w_uv_t");
      l.uk_packed = item<at::Tensor>(d, "uk_packed"), l.uv_packed = item<at::Tensor>(d, "uv_packed");
      l.rope_slots = optional_tensor(d, "rope_slots"), l.mix = optional_tensor(d, "mix");
      l.mix_packed = optional_tensor(d, "mix_packed");
      l.qkv_a = plan_linear(d, "qkv_a"), l.q_b = plan_linear(d, "q_b"), l.o = plan_linear(d, "o");
      l.gate_up = plan_linear(d, "gate_up"), l.down = plan_linear(d, "down"), l.moe = plan_moe(d);
      l.q_dim = item<int64_t>(d, "q_dim"), l.heads = item<int64_t>(d, "heads");
      l.dn = item<int64_t>(d, "dn"), l.dr = item<int64_t>(d, "dr"), l.dv = item<int64_t>(d, "dv");
      l.rank = item<int64_t>(d, "rank"), l.scale = item<double>(d, "scale");
      l.interleaved = item<bool>(d, "interleaved");
      l.kv = optional_tensor(d, "kv"), l.latent = optional_tensor(d, "latent");
      l.cache_scale = optional_tensor(d, "cache_scale"), l.cache_rope = optional_tensor(d, "cache_rope");
      l.qmax = item<double>(d, "qmax"), l.block_size = item<int64_t>(d, "block_size");
      layers_.push_back(std::move(l));
    }
  }

  // x [B, hidden] (the embeddings), cos/sin [layers, B, dr/2], slots [B], block_tables [B, nb],
  // context_lens [B] -> the final RMSNorm of the last layer's output [B, hidden] (what the model returns).
  at::Tensor run(at::Tensor x, at::Tensor cos, at::Tensor sin, at::Tensor slots, at::Tensor block_tables,
                 at::Tensor context_lens, int64_t threads) const {
    const int64_t B = x.size(0);
    at::Tensor carry;  // the previous layer's MLP output, added to x as the layer's return value
    const at::Tensor none;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const PlanLayer& l = layers_[i];
      // DecoderLayer: return x + mlp(normed); the sum rounded as at::add rounds it, then normed (one pass)
      std::vector<at::Tensor> in = rms_norm(carry.defined() ? carry : x, l.w_in, l.eps_in, carry.defined() ? x : x.new_empty(0),
                                            isa_ops_);
      if (carry.defined()) x = in[0];
      at::Tensor h = in[1];
      at::Tensor qkv = linear(l.qkv_a, h);
      at::Tensor q = qkv.narrow(1, 0, l.q_dim);
      at::Tensor c = qkv.narrow(1, l.q_dim, l.rank), k_r = qkv.narrow(1, l.q_dim + l.rank, l.dr);
      if (l.q_b.out) q = linear(l.q_b, rms_norm(q, l.w_q_a_norm, l.eps_latent, q.new_empty(0), isa_ops_)[1]);
      if (l.w_kv_a_norm.defined()) c = rms_norm(c, l.w_kv_a_norm, l.eps_latent, c.new_empty(0), isa_ops_)[1];
      q = q.view({B, l.heads, -1});
      at::Tensor cos_i = cos[i], sin_i = sin[i];
      const at::Tensor e = x.new_empty(0);
      at::Tensor q_rope;
      if (l.mix.defined()) {  // MLAttention.project + full_rope: the un-mixed pairs turn, then mix back
        q_rope = rope(q.narrow(2, l.dn, q.size(2) - l.dn), cos_i, sin_i, true, isa_ops_, l.rope_slots);
        q_rope = head_matmul(q_rope, l.mix, 1.0, e, isa_ops_, l.mix_packed);
      } else {
        q_rope = rope(q.narrow(2, l.dn, l.dr), cos_i, sin_i, l.interleaved, isa_ops_, e);
      }
      write_latent(c, k_r, cos_i, sin_i, l.interleaved, slots, l.kv.defined() ? l.kv : e,
                   l.latent.defined() ? l.latent : e, l.cache_scale.defined() ? l.cache_scale : e,
                   l.cache_rope.defined() ? l.cache_rope : e, l.qmax, isa_ops_);
      at::Tensor query = head_matmul(q.narrow(2, 0, l.dn), l.w_uk, l.scale, q_rope, isa_ops_, l.uk_packed).view({B, l.heads, -1});
      at::Tensor o_lat = decode_(query, l.kv.defined() ? l.kv : e, l.latent.defined() ? l.latent : e,
                                 l.cache_scale.defined() ? l.cache_scale : e, l.cache_rope.defined() ? l.cache_rope : e,
                                 block_tables, context_lens, context_lens.new_empty(0), l.heads, l.rank, l.block_size,
                                 isa_attention_, threads);
      at::Tensor attn = head_matmul(o_lat, l.w_uv_t, 1.0, e, isa_ops_, l.uv_packed).view({B, l.heads * l.dv});
      std::vector<at::Tensor> post = rms_norm(x, l.w_post, l.eps_post, linear(l.o, attn), isa_ops_);
      x = post[0];
      if (l.moe.defined) {  // MoE.forward: the router, then the experts in one call
        const PlanMoe& m = l.moe;
        auto [weights, ids] = route_tokens(m, post[1], linear_, route_, isa_linear_);
        carry = moe_(post[1], weights, ids, m.gate_up, m.down, m.shared_gate_up, m.shared_down, m.kind, m.inter,
                     m.shared_inter, isa_linear_);
      } else {
        carry = linear(l.down, silu_mul(linear(l.gate_up, post[1]), isa_ops_));
      }
    }
    // DeepseekModel: self.norm(x + mlp(normed))
    return rms_norm(carry.defined() ? carry : x, w_norm_, eps_norm_, carry.defined() ? x : x.new_empty(0), isa_ops_)[1];
  }

 private:
  at::Tensor linear(const PlanLinear& p, const at::Tensor& x) const {
    at::Tensor y = linear_(x, p.packed, p.kind, p.out, isa_linear_);
    return p.bias.defined() ? at::add(y, p.bias) : y;  // QuantLinear.forward: y + bias, out of place
  }

  at::Tensor w_norm_;
  double eps_norm_;
  LinearFn linear_;
  MoeFn moe_;
  RouteFn route_;
  DecodeFn decode_;
  int64_t isa_ops_, isa_linear_, isa_attention_;
  std::vector<PlanLayer> layers_;
};

static void register_decode_plan(py::module_& m) {
  py::class_<DecodePlan>(m, "DecodePlan")
      .def(py::init<py::list, at::Tensor, double, py::capsule, py::capsule, py::capsule, py::capsule, int64_t, int64_t,
                    int64_t>())
      // without the GIL: the server's other threads (tokenizing, HTTP) run during the step
      .def("run", &DecodePlan::run, py::call_guard<py::gil_scoped_release>(),
           "the decoder layers of one all-decode step (see decode_step.h)");
}
