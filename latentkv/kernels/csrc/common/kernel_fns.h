// The functions one extension hands another through a PyCapsule: the decode plan
// (decode_ops/decode_step.cpp) calls qlinear's `linear` and `moe` and attention's `mla_decode` with no Python
// between. Their types are written once, here, and checked on both sides: the exporting extension
// builds its capsule from its function as that type (`export_fn`: a signature that differs does not
// compile), and names the capsule by the type's mangled name, which the importing extension
// compares with its own (`import_fn`: a build of the other side from another version of this
// header is refused with a message, never called through the wrong type).
#pragma once
#include "torch_lite.h"

#include <string>
#include <tuple>
#include <typeinfo>

// x [M, K] float32 / bf16, packed weight, record kind, out_features, caps -> [M, out_features]
// (qlinear/qlinear.cpp `linear`)
using LinearFn = at::Tensor (*)(at::Tensor, at::Tensor, int64_t, int64_t, int64_t);
// x [M, K] bf16, a packed bf16 [gate; up] weight of 2I rows, I, caps -> silu(gate) * up [M, I]
// (qlinear/qlinear.cpp `swiglu_linear`)
using SwigluFn = at::Tensor (*)(at::Tensor, at::Tensor, int64_t, int64_t);
// x [T, D], weights [T, k], ids [T, k], gate_up [E, ...], down [E, ...], shared_gate_up, shared_down, kind,
// inter, shared_inter, caps -> [T, D] (qlinear/moe.h `moe`)
using MoeFn = at::Tensor (*)(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t,
                             int64_t, int64_t, int64_t);
// logits [T, E] float32, bias [E] (empty: none), softmax, n_group, topk_group, noaux, group_limited, k,
// normalized, scale -> (weights [T, k] float32, ids [T, k]) (qlinear/moe_route.h `moe_route`)
using RouteFn = std::tuple<at::Tensor, at::Tensor> (*)(at::Tensor, at::Tensor, bool, int64_t, int64_t, bool, bool, int64_t,
                                                       bool, double);
// query, kv, latent, scale, rope, cache_kind (attention/cache_kinds.h), block_tables, context_lens, query_pos,
// heads, kv_rank, block_size, caps, threads -> o_lat (attention/mla_attention.cpp `mla_decode`)
using DecodeFn = at::Tensor (*)(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, at::Tensor,
                                at::Tensor, at::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t);

// query, codes, scales, runs, steps, cs, latent_values, block_tables, context_lens, query_pos, heads, block_size,
// caps, threads -> o_lat in the code's turned basis (attention/mla_attention.cpp `mla_decode_coded`)
using CodedDecodeFn = at::Tensor (*)(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t,
                                     at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t, int64_t);

template <typename F>
inline const char* fn_type_name() {
  static const std::string name = std::string("latentkv:") + typeid(F).name();  // lives as long as the library
  return name.c_str();
}

template <typename F>
inline py::capsule export_fn(F fn) {
  return py::capsule(reinterpret_cast<void*>(fn), fn_type_name<F>());
}

template <typename F>
inline F import_fn(const py::capsule& c, const char* what) {
  const char* name = c.name();
  TORCH_CHECK(name != nullptr && std::string(name) == fn_type_name<F>(), "the capsule for ", what, " holds ",
              name ? name : "(no name)", "; this extension calls ", fn_type_name<F>(),
              " (build the extensions from one checkout)");
  return reinterpret_cast<F>(c.get_pointer());
}
