// latentkv weight-only quantized linears (CPU): y [M, N] = x [M, K] · Wᵀ with W stored as group-32
// int4 (scale + zero per group), int8 (scale per row) or plain bf16 / float32 (the batch-invariant
// linears), packed by latentkv/kernels/qlinear.py (layout:
// qlinear_impl.h). Activations float32 or bfloat16 (widened to float32 once), float32 accumulation
// in a fixed order per output element: batch-invariant. Threads (at::parallel_for, torch's) split
// the output rows, never K.
//   linear(x [M, K], packed int32 [NB, G, REC], kind 4|8|16|32, N, caps) -> y [M, N] in x's dtype
//   (caps: the capabilities that serve, cpu_isa.h; the best of qlinear_paths.h's paths they allow runs).
// And the integer-dot linears (qlinear_dot_impl.h): activations quantized to int8 per row and
// group of 32, int4 (w4a8: kind 104) or int8 (w8a8: kind 108) weights, AVX-512 VNNI vpdpbusd /
// AVX2 maddubs / scalar, through the same entry (so the decode plan's capsule runs them too).
// And a MoE layer's experts in one call (moe.h), over the same kernels as work units (qlinear_kernel.h).
// This file holds the entries; each ISA's kernels are their own unit (qlinear_paths.h).
#include "isa_paths.h"
#include "kernel_fns.h"
#include "torch_lite.h"
#include "qlinear_common.h"

// The record sizes (Kernel::rec) from the scalar path's formats (its kernels are qlinear_scalar.cpp's)
// and its SwiGLU rows
namespace isa_scalar {
#include "qlinear_vec_scalar.h"
#include "qlinear_impl.h"
#include "qlinear_dot_scalar.h"  // W4, W8
#include "exp_poly.h"     // common/: e^x (SwiGLU's)
#include "swiglu_rows.h"  // common/: SwiGLU's rows (decode_ops' silu_mul runs the same)
}  // namespace isa_scalar

#include "qlinear_kernel.h"  // the kernels of each kind as work units, the activations they read

void check_x(const at::Tensor& x, const at::Tensor& packed, int64_t caps) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "qlinear: CPU tensors only");
  check_caps(caps, "qlinear");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "qlinear: x must be [M, K] float32 or bfloat16");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kInt && packed.is_contiguous(),
              "qlinear: packed must be contiguous int32 [NB, G, REC]");
}

constexpr IsaPath PATHS[] = {{"avx2", NEEDS_AVX2},           {"avx512", NEEDS_AVX512},     {"avx512_vnni", NEEDS_AVX512_VNNI},
                             {"avx512_bf16", NEEDS_AVX512_BF16}, {"amx_bf16", NEEDS_AMX_BF16}, {"amx_int8", NEEDS_AMX_INT8}};

// A packed weight [NB, G, rec] (packed.py pads its rows to a multiple of 64 and K to whole groups of
// `group` inputs: Kernel::group) fits K inputs and N outputs: the shape rule of every entry. `what` names the weight.
static void check_fit(int64_t NB, int64_t G, int64_t rec_found, int64_t rec, int64_t group, int64_t K, int64_t N,
                      const char* what) {
  const int64_t Kp = G * group;
  TORCH_CHECK(rec_found == rec && NB % 4 == 0 && N <= NB * 16 && N > NB * 16 - 64 && K <= Kp && K > Kp - group, "qlinear: ",
              what, " [", NB, ", ", G, ", ", rec_found, "] does not fit ", K, " inputs and ", N, " outputs (records of ",
              rec, " words)");
}

// y [M, N] = x [M, K] · Wᵀ in x's dtype (kinds: qlinear_kernel.h), one linear's work units over the threads.
at::Tensor linear(at::Tensor x, at::Tensor packed, int64_t kind, int64_t N, int64_t caps) {
  check_x(x, packed, caps);
  const Kernel kernel(kind, caps, x.scalar_type() == at::kBFloat16);
  const int64_t M = x.size(0), G = packed.size(1);
  check_fit(packed.size(0), G, packed.size(2), kernel.rec(), kernel.group(), x.size(1), N, "packed weight");
  auto out = at::empty({M, N}, x.options().dtype(kernel.out_type()));
  if (M > 0 && N > 0) {
    const Act a = kernel.prepare(x, G, true);
    const int32_t* w = packed.data_ptr<int32_t>();
    void* y = out.data_ptr();
    at::parallel_for(0, kernel.units(M, N), 1,
                     [&](int64_t begin, int64_t end) { kernel.run(w, G, a, 0, M, y, N, N, begin, end); });
  }
  return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
}

// silu(x · W_gateᵀ) * (x · W_upᵀ) [M, I] bf16 for bf16 rows x [M, K] and a bf16 [gate; up] weight of 2I
// rows on AMX (I a multiple of 16): the SwiGLU in the product's last step, where `linear` then
// silu_mul wrote [M, 2I] and read it back. The same bits as those two (swiglu_rows_out).
at::Tensor swiglu_linear(at::Tensor x, at::Tensor packed, int64_t I, int64_t caps) {
  check_x(x, packed, caps);
  const Kernel kernel(16, caps, x.scalar_type() == at::kBFloat16);
  TORCH_CHECK(kernel.amx() && I > 0 && I % 16 == 0,
              "qlinear: the fused SwiGLU runs bf16 rows on AMX (amx_bf16) with I a multiple of 16, got I = ", I);
  const int64_t M = x.size(0), G = packed.size(1);
  check_fit(packed.size(0), G, packed.size(2), kernel.rec(), kernel.group(), x.size(1), 2 * I, "packed gate_up weight");
  auto out = at::empty({M, I}, x.options());
  if (M > 0) {
    const Act a = kernel.prepare(x, G, true);
    const int32_t* w = packed.data_ptr<int32_t>();
    uint16_t* y = static_cast<uint16_t*>(out.data_ptr());
    at::parallel_for(0, isa_amx::unit_count(I, true), 1,
                     [&](int64_t begin, int64_t end) { kernel.run_swiglu(w, G, a, 0, M, y, I, begin, end); });
  }
  return out;
}

// x [M, K] -> int8 codes [M, Kp], d_x [M, G], s_x [M, G] and the codes' sums [M, G] int32 as the
// integer-dot linears of record `kind` quantize it (qlinear_dot_impl.h; exposed for the tests' reference).
std::vector<at::Tensor> quantize_activations(at::Tensor x, int64_t G, int64_t kind, int64_t caps) {
  check_x(x, at::empty({1, 1, 1}, at::kInt), caps);
  const Kernel kernel(kind, caps, false);
  TORCH_CHECK(kernel.dot() && x.size(1) <= G * kernel.group(), "qlinear: x has more than G * ", kernel.group(),
              " inputs or kind ", kind, " has no int8 activations");
  const Act a = kernel.prepare(x, G, false);
  return {a.rows, a.sums, a.sx, a.qsum};
}

// Which path runs the integer-dot linears under `caps` here: avx512_vnni, avx2 or scalar.
std::string dot_path(int64_t caps) {
  check_caps(caps, "qlinear");
  return Kernel(104, caps, false).dot_path();
}

#include "swiglu.h"  // common/: silu_mul (decode_ops' too), for the MoE op

// The SwiGLU rows silu_mul runs under caps (qlinear_avx512.cpp's, qlinear_avx2.cpp's, the scalar ones above).
SiluRows silu_rows(int64_t caps) {
  if (has(caps, NEEDS_AVX512)) return isa_avx512::silu_path();
  if (has(caps, NEEDS_AVX2)) return isa_avx2::silu_path();
  return {isa_scalar::silu_mul_rows, isa_scalar::silu_mul_rows};
}
#include "moe.h"
#include "moe_route.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL released while the kernels run: the server's event loop and tokenizer thread go on beside them
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>(), "int4 / int8 / bf16 / float32 (kind 4, 8, 16, 32: qlinear_impl.h) or w4a8 / w8a8 (104, 108: qlinear_dot_impl.h) linear over a packed weight");
  m.def("swiglu_linear", &swiglu_linear, py::call_guard<py::gil_scoped_release>(), "silu(gate) * up of a bf16 [gate; up] linear on AMX, in the product's last step");
  m.def("moe", &moe, py::call_guard<py::gil_scoped_release>(), "a MoE layer's routed and shared experts (see moe.h)");
  m.def("moe_route", &moe_route, py::call_guard<py::gil_scoped_release>(), "a MoE layer's router after its logits: the k experts of each token and their weights (see moe_route.h)");
  m.def("quantize_activations", &quantize_activations, py::call_guard<py::gil_scoped_release>(), "x -> the dot linears' int8 codes, d_x, s_x and the codes' sums");
  m.def("dot_path", &dot_path, "the integer-dot linears' path under a set of capabilities: avx512_vnni, avx2 or scalar");
  def_isa_paths(m, PATHS);
  // for the decode plan (decode_ops/decode_step.cpp), which calls these without Python between
  m.attr("linear_capsule") = export_fn<LinearFn>(&linear);  // of the types kernel_fns.h declares
  m.attr("swiglu_capsule") = export_fn<SwigluFn>(&swiglu_linear);
  m.attr("moe_capsule") = export_fn<MoeFn>(&moe);
  m.attr("route_capsule") = export_fn<RouteFn>(&moe_route);
}
