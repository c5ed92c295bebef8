// A whole decode step's decoder layers in one call (model/decode_plan.py builds the plan): the
// same kernels, with the same arguments, in the same order as the PyTorch modules call them
// (model/deepseek.py DecoderLayer, model/mla.py MLAttention on the absorbed path, model/quant.py
// linears, kernels/attention.py mla_decode), so the result is bit-identical to the module path;
// what goes is the Python between them (~40% of a batch-1 step at short context on 2 threads:
// module calls, views, checks). Its ops (rms_norm, rope, write_latent, head_matmul, silu_mul) are
// declared in decode_ops.h and defined in decode_ops.cpp; the weight linears, a MoE layer's experts
// and the attention kernels live in the other two extensions and come in as function pointers
// (PyCapsules their modules export, of the types in common/kernel_fns.h, checked when the plan is
// built); a MoE layer's router runs as its module does (plan_moe.h). Its inputs are typed, declared once:
// plan_layer.h.
//
// Applies to steps whose rows are all single-token decodes of distinct sequences (row b =
// sequence b), linears that run latentkv's packed kernel (a MoE layer's experts its native call);
// the Python side checks.
#include "decode_step.h"

#include "coded_ops.h"
#include "decode_ops.h"
#include "kernel_fns.h"
#include "plan_layer.h"
#include "plan_moe.h"
#include "torch_lite.h"

#include <ATen/ops/add.h>  // a linear's bias
#include <ATen/ops/index_select.h>  // a folded query's rope slots

#include <cstdint>
#include <string>
#include <vector>

namespace {

class DecodePlan {
 public:
  DecodePlan(py::list layers, at::Tensor w_norm, double eps_norm, py::capsule linear_fn, py::capsule swiglu_fn,
             py::capsule moe_fn, py::capsule route_fn, py::capsule decode_fn, py::capsule coded_decode_fn,
             int64_t caps_ops, int64_t caps_linear, int64_t caps_attention)
      : w_norm_(w_norm), eps_norm_(eps_norm), linear_(import_fn<LinearFn>(linear_fn, "qlinear's linear")),
        swiglu_(import_fn<SwigluFn>(swiglu_fn, "qlinear's swiglu_linear")),
        moe_(import_fn<MoeFn>(moe_fn, "qlinear's moe")), route_(import_fn<RouteFn>(route_fn, "qlinear's moe_route")),
        decode_(import_fn<DecodeFn>(decode_fn, "attention's mla_decode")),
        coded_decode_(import_fn<CodedDecodeFn>(coded_decode_fn, "attention's mla_decode_coded")),
        caps_ops_(caps_ops), caps_linear_(caps_linear), caps_attention_(caps_attention) {
    for (py::handle h : layers) {
      TORCH_CHECK(py::isinstance<PlanLayer>(h), "DecodePlan: layer ", layers_.size(), " is not a PlanLayer");
      PlanLayer l = h.cast<PlanLayer>();
      const std::string at = "DecodePlan: layer " + std::to_string(layers_.size()) + ": ";
      TORCH_CHECK(l.q_b.defined == l.w_q_a_norm.defined(), at, "q_b and w_q_a_norm go together (q_lora_rank)");
      TORCH_CHECK(l.moe.defined != (l.gate_up.defined && l.down.defined), at,
                  "a layer has a MoE (moe) or a dense MLP (gate_up and down), one of them");
      TORCH_CHECK(!l.coded.defined || l.cs_index >= 0, at, "a transform-coded cache names its cos / sin table (cs_index)");
      if (l.moe.defined) {  // MoE.native's absent shared experts: empty tensors, as qlinear's moe takes them
        if (!l.moe.shared_gate_up.defined()) l.moe.shared_gate_up = l.moe.gate_up.new_empty(0);
        if (!l.moe.shared_down.defined()) l.moe.shared_down = l.moe.gate_up.new_empty(0);
      }
      layers_.push_back(std::move(l));
    }
  }

  // x [B, hidden] (the embeddings), cos/sin [layers, B, dr/2], slots [B], block_tables [B, nb],
  // context_lens [B], cs: the transform-coded layers' cos / sin tables [positions, width] float32 (coded.py
  // KernelView.cs; empty without) -> the final RMSNorm of the last layer's output [B, hidden] (what the
  // model returns).
  at::Tensor run(at::Tensor x, at::Tensor cos, at::Tensor sin, at::Tensor slots, at::Tensor block_tables,
                 at::Tensor context_lens, std::vector<at::Tensor> cs, int64_t threads) const {
    const int64_t B = x.size(0);
    at::Tensor carry;  // the previous layer's MLP output, added to x as the layer's return value
    const at::Tensor none;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const PlanLayer& l = layers_[i];
      // DecoderLayer: return x + mlp(normed); the sum rounded as at::add rounds it, then normed (one pass)
      std::vector<at::Tensor> in = rms_norm(carry.defined() ? carry : x, l.w_in, l.norm_eps, carry.defined() ? x : x.new_empty(0),
                                            caps_ops_);
      if (carry.defined()) x = in[0];
      at::Tensor h = in[1];
      at::Tensor qkv = linear(l.qkv_a, h);
      at::Tensor q = qkv.narrow(1, 0, l.q_dim);
      at::Tensor c = qkv.narrow(1, l.q_dim, l.kv_rank), k_r = qkv.narrow(1, l.q_dim + l.kv_rank, l.dr);
      if (l.q_b.defined) q = linear(l.q_b, rms_norm(q, l.w_q_a_norm, l.latent_eps, q.new_empty(0), caps_ops_)[1]);
      if (l.w_kv_a_norm.defined()) c = rms_norm(c, l.w_kv_a_norm, l.latent_eps, c.new_empty(0), caps_ops_)[1];
      q = q.view({B, l.n_heads, -1});
      at::Tensor cos_i = cos[i], sin_i = sin[i];
      const at::Tensor e = x.new_empty(0);
      at::Tensor q_rope;
      if (l.mix.defined()) {  // MLAttention.project + full_rope: the un-mixed pairs turn, then mix back
        q_rope = rope(q.narrow(2, l.dn, q.size(2) - l.dn), cos_i, sin_i, true, caps_ops_, l.rope_slots);
        q_rope = head_matmul(q_rope, l.mix, 1.0, e, caps_ops_, l.mix_packed);
      } else {
        q_rope = rope(q.narrow(2, l.dn, l.dr), cos_i, sin_i, l.interleaved, caps_ops_, e);
      }
      if (l.coded.defined) coded_write(c, k_r, cos_i, sin_i, slots, l.latent, l.cache_scale, l.coded);
      else write_latent(c, k_r, cos_i, sin_i, l.interleaved, slots, l.kv, l.latent, l.cache_scale, l.cache_rope, l.qmax, caps_ops_);
      // a transform-coded cache: w_uk and w_uv_t come turned into its basis (MLAttention.absorb / unabsorb with
      // the code's turn), the rope query mapped into the kernel's row beside them
      if (l.coded.defined) q_rope = coded_rope_query(q_rope, l.coded, linear_, caps_linear_);
      at::Tensor query = head_matmul(q.narrow(2, 0, l.dn), l.w_uk, l.scale, q_rope, caps_ops_, l.uk_packed).view({B, l.n_heads, -1});
      at::Tensor o_lat;
      if (l.coded.defined) {
        TORCH_CHECK(l.cs_index < (int64_t)cs.size(), "DecodePlan.run: layer ", i, " reads cos / sin table ", l.cs_index,
                    " of ", cs.size());
        o_lat = coded_decode_(query, l.latent, l.cache_scale, l.coded.runs, l.coded.steps, cs[l.cs_index],
                              l.coded.latent_columns, block_tables, context_lens, context_lens.new_empty(0), l.n_heads,
                              l.block_size, caps_attention_, threads);
      } else {
        o_lat = decode_(query, l.kv, l.latent, l.cache_scale, l.cache_rope, l.cache_kind, block_tables, context_lens,
                        context_lens.new_empty(0), l.n_heads, l.kv_rank, l.block_size, caps_attention_, threads);
      }
      at::Tensor attn = head_matmul(o_lat, l.w_uv_t, 1.0, e, caps_ops_, l.uv_packed);
      if (l.uv_bias.defined()) attn = at::add(attn, l.uv_bias);  // (MLAttention.unabsorb's, with a turn)
      attn = attn.view({B, l.n_heads * l.dv});
      std::vector<at::Tensor> post = rms_norm(x, l.w_post, l.norm_eps, linear(l.o, attn), caps_ops_);
      x = post[0];
      if (l.moe.defined) {  // MoE.forward: the router, then the experts in one call
        const PlanMoe& m = l.moe;
        auto [weights, ids] = route_tokens(m, post[1], linear_, route_, caps_linear_);
        carry = moe_(post[1], weights, ids, m.gate_up, m.down, m.shared_gate_up, m.shared_down, m.kind, m.inter,
                     m.shared_inter, caps_linear_);
      } else if (l.gate_up.swiglu) {  // MLP.forward through FixedOrderLinear.swiglu
        carry = linear(l.down, swiglu_(post[1], l.gate_up.packed, l.gate_up.out / 2, caps_linear_));
      } else {
        carry = linear(l.down, silu_mul(linear(l.gate_up, post[1]), caps_ops_));
      }
    }
    // DeepseekModel: self.norm(x + mlp(normed))
    return rms_norm(carry.defined() ? carry : x, w_norm_, eps_norm_, carry.defined() ? x : x.new_empty(0), caps_ops_)[1];
  }

 private:
  at::Tensor linear(const PlanLinear& p, const at::Tensor& x) const {
    at::Tensor y = linear_(x, p.packed, p.kind, p.out, caps_linear_);
    return p.bias.defined() ? at::add(y, p.bias) : y;  // QuantLinear.forward: y + bias, out of place
  }

  at::Tensor w_norm_;
  double eps_norm_;
  LinearFn linear_;
  SwigluFn swiglu_;
  MoeFn moe_;
  RouteFn route_;
  DecodeFn decode_;
  CodedDecodeFn coded_decode_;
  int64_t caps_ops_, caps_linear_, caps_attention_;
  std::vector<PlanLayer> layers_;
};

}  // namespace

void register_decode_plan(py::module_& m) {
  bind_plan_struct<PlanLinear>(m);
  bind_plan_struct<PlanMoe>(m);
  bind_plan_struct<PlanCodedSide>(m);
  bind_plan_struct<PlanCoded>(m);
  bind_plan_struct<PlanLayer>(m);
  py::class_<DecodePlan>(m, "DecodePlan")
      .def(py::init<py::list, at::Tensor, double, py::capsule, py::capsule, py::capsule, py::capsule, py::capsule,
                    py::capsule, int64_t, int64_t, int64_t>())
      // without the GIL: the server's other threads (tokenizing, HTTP) run during the step
      .def("run", &DecodePlan::run, py::call_guard<py::gil_scoped_release>(),
           "the decoder layers of one all-decode step (see decode_step.cpp)");
}
