// The decode plan's inputs, typed and declared once (model/decode_plan.py fills them by these names; the
// spec's shapes and constants under model/spec.py LayerSpec's own names): each struct's fields are its
// X-macro list, X(type, name, required); plan_fields.h builds it from Python keywords and refuses an
// unknown name, a wrong type or a missing required field when the plan is built.
#pragma once
#include "plan_fields.h"
#include "torch_lite.h"

#include <cstdint>

// A packed linear as qlinear's `linear` takes it (QuantLinear: weight_packed, record, out_features, bias);
// swiglu: a [gate; up] weight that qlinear's `swiglu_linear` runs (quant.py FixedOrderLinear.swiglu's
// conditions), silu(gate) * up in the product's last step with the bits of `linear` then silu_mul.
#define LATENTKV_PLAN_LINEAR(X)  \
  X(at::Tensor, packed, true)    \
  X(int64_t, kind, true)         \
  X(int64_t, out, true)          \
  X(at::Tensor, bias, false) /* undefined: none */ \
  X(bool, swiglu, false)

struct PlanLinear {
  static constexpr const char* NAME = "PlanLinear";
  bool defined = false;  // false: the layer has no such linear
  LATENTKV_FIELDS(LATENTKV_PLAN_LINEAR)
};

// A MoE layer: its router (model/deepseek.py Gate: weight [E, D] float32, gate_packed in qlinear's float32
// record or undefined: the padded sgemm, e_score_correction_bias [E] or undefined, and its choices) and its
// experts as MoE.native holds them (shared ones undefined when there are none).
#define LATENTKV_PLAN_MOE(X)              \
  X(at::Tensor, gate, true)               \
  X(at::Tensor, gate_packed, false)       \
  X(at::Tensor, bias, false)              \
  X(bool, softmax, true)                  \
  X(bool, group_limited, true)            \
  X(bool, noaux, true)                    \
  X(bool, normalized, true)               \
  X(int64_t, n_group, true)               \
  X(int64_t, topk_group, true)            \
  X(int64_t, k, true)                     \
  X(double, scale, true)                  \
  X(int64_t, safe_rows, true)             \
  X(at::Tensor, gate_up, true)            \
  X(at::Tensor, down, true)               \
  X(at::Tensor, shared_gate_up, false)    \
  X(at::Tensor, shared_down, false)       \
  X(int64_t, kind, true)                  \
  X(int64_t, inter, true)                 \
  X(int64_t, shared_inter, true)

struct PlanMoe {
  static constexpr const char* NAME = "PlanMoe";
  bool defined = false;  // false: a dense layer
  LATENTKV_FIELDS(LATENTKV_PLAN_MOE)
};

// One side (latent or rope key) of a transform-coded layer, as transform_code.SideMaps holds it: turn
// [stored, n] float32 and back (its transpose, contiguous), each stored value's group int64 [stored], the
// groups' sizes float32 [groups], STEP and 2^(b-1) of each value float32 [stored], and top = 2 half - 1 (the
// largest code).
#define LATENTKV_PLAN_CODED_SIDE(X) \
  X(at::Tensor, turn, true)         \
  X(at::Tensor, back, true)         \
  X(at::Tensor, group, true)        \
  X(at::Tensor, sizes, true)        \
  X(at::Tensor, step, true)         \
  X(at::Tensor, half, true)         \
  X(at::Tensor, top, true)

struct PlanCodedSide {
  static constexpr const char* NAME = "PlanCodedSide";
  bool defined = false;
  LATENTKV_FIELDS(LATENTKV_PLAN_CODED_SIDE)
};
template <>
struct plan_fields::From<PlanCodedSide> : plan_fields::FromStruct<PlanCodedSide> {};  // (before PlanCoded uses it)

// A transform-coded layer's cache (cache/coded.py native_code): the writer's sides, means (undefined: not
// centred; both float32, the rope key's before RoPE), RoPE layout and each packed value's width uint8
// [stored, both sides]; the reader's runs and steps (kernels/attention.py coded_runs), the rope query's map
// into the kernel's row float32 [E, dr] and the same packed for qlinear's float32 record (undefined:
// invariant.linear's padded sgemm), and the kernel's output columns. The layer's W_UK and W_UVᵀ come
// turned (PlanLayer's w_uk, w_uv_t and uv_bias: MLAttention.turned_heads).
#define LATENTKV_PLAN_CODED(X)          \
  X(PlanCodedSide, latent_side, true)   \
  X(PlanCodedSide, rope_side, true)     \
  X(at::Tensor, latent_mean, false)     \
  X(at::Tensor, rope_mean, false)       \
  X(bool, interleaved, true)            \
  X(at::Tensor, widths, true)           \
  X(at::Tensor, runs, true)             \
  X(at::Tensor, steps, true)            \
  X(at::Tensor, rope_map, true)         \
  X(at::Tensor, rope_packed, false)     \
  X(int64_t, latent_columns, true)

struct PlanCoded {
  static constexpr const char* NAME = "PlanCoded";
  bool defined = false;  // false: the layer's cache is not transform-coded
  LATENTKV_FIELDS(LATENTKV_PLAN_CODED)
};

template <>
struct plan_fields::From<PlanLinear> : plan_fields::FromStruct<PlanLinear> {};
template <>
struct plan_fields::From<PlanCoded> : plan_fields::FromStruct<PlanCoded> {};
template <>
struct plan_fields::From<PlanMoe> : plan_fields::FromStruct<PlanMoe> {};

// One decoder layer: weights (norms undefined when absent), the absorbed heads' weights and their AMX
// packs (empty off AMX), a folded query projection's rope slots and mix (model/rope_groups.py; undefined
// without), the spec's shapes and constants, and the layer's cache as the kernels take it
// (LatentCache.kernel_tensors: kv, or latent + scale + rope; the others empty), its format's code for the
// attention kernel (kernels/attention.py cache_kind) and its qmax; a transform-coded cache: its code
// (`coded`; cache_kind unused), which of the step's cos / sin tables (`cs`) its reader takes, and W_UV's
// image of the latent's mean [H, dv] in the activations' dtype, added to the values (undefined: none).
#define LATENTKV_PLAN_LAYER(X)          \
  X(at::Tensor, w_in, true)             \
  X(at::Tensor, w_post, true)           \
  X(at::Tensor, w_q_a_norm, false)      \
  X(at::Tensor, w_kv_a_norm, false)     \
  X(at::Tensor, w_uk, true)             \
  X(at::Tensor, w_uv_t, true)           \
  X(at::Tensor, uk_packed, true)        \
  X(at::Tensor, uv_packed, true)        \
  X(PlanLinear, qkv_a, true)            \
  X(PlanLinear, q_b, false)             \
  X(PlanLinear, o, true)                \
  X(PlanLinear, gate_up, false)         \
  X(PlanLinear, down, false)            \
  X(PlanMoe, moe, false)                \
  X(at::Tensor, rope_slots, false)      \
  X(at::Tensor, mix, false)             \
  X(at::Tensor, mix_packed, false)      \
  X(int64_t, q_dim, true)               \
  X(int64_t, n_heads, true)             \
  X(int64_t, dn, true)                  \
  X(int64_t, dr, true)                  \
  X(int64_t, dv, true)                  \
  X(int64_t, kv_rank, true)             \
  X(double, scale, true)                \
  X(bool, interleaved, true)            \
  X(double, norm_eps, true)             \
  X(double, latent_eps, true)           \
  X(at::Tensor, kv, true)               \
  X(at::Tensor, latent, true)           \
  X(at::Tensor, cache_scale, true)      \
  X(at::Tensor, cache_rope, true)       \
  X(int64_t, cache_kind, true)          \
  X(double, qmax, true)                 \
  X(int64_t, block_size, true)          \
  X(PlanCoded, coded, false)            \
  X(int64_t, cs_index, false)           \
  X(at::Tensor, uv_bias, false)

struct PlanLayer {
  static constexpr const char* NAME = "PlanLayer";
  LATENTKV_FIELDS(LATENTKV_PLAN_LAYER)
};

// Each as a Python class built from keywords (PlanLayer(w_in=..., ...)); FIELDS lists each one's names.
template <typename S>
void bind_plan_struct(py::module_& m) {
  py::class_<S>(m, S::NAME)
      .def(py::init([](py::kwargs kwargs) { return plan_fields::from_kwargs<S>(kwargs); }))
      .def_property_readonly_static("FIELDS", [](py::object) { return S::names(); });
}
