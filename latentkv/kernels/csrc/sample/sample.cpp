// latentkv's batched sampler (CPU): one token per row of float32 logits under each row's temperature,
// top_k, top_p and min_p, drawn by inverse CDF with the row's own uniform (sample_impl.h has the
// method). Rows run in parallel (at::parallel_for, torch's threads), each alone: its token never
// depends on the batch. Each ISA's rows are their own unit (sample_<isa>.cpp; sample_common.h).
//   sample_rows(logits [*, V] float32, rows [N] int64, temperature [N] float32, top_k [N] int64,
//               top_p [N] float32, min_p [N] float32, u [N] float64, kept, isa) -> tokens [N] int64
// kept: empty, or [N, V] float32 that gets each row's weights after truncation (the tests' view of
// the kept set and its probabilities; a row that returns early, NaN or all -inf, leaves its row as is).
#include "cpu_isa.h"
#include "sample_common.h"
#include "torch_lite.h"

std::vector<int64_t> supported_isas() { return isas_up_to(2); }

static SampleRow row_fn(int64_t isa) {
  if (isa >= 2) return isa_avx512::sample_row;
  if (isa == 1) return isa_avx2::sample_row;
  return isa_scalar::sample_row;
}

at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& rows, const at::Tensor& temperature,
                       const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& u,
                       const at::Tensor& kept, int64_t isa) {
  TORCH_CHECK(isa_supported(isa), "sample: this CPU does not support instruction set ", isa);
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "sample: logits must be CPU float32 [*, V] with contiguous rows");
  const int64_t N = rows.numel(), V = logits.size(1), R = logits.size(0);
  auto check = [N](const at::Tensor& t, at::ScalarType dt, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 1 && t.numel() == N && t.scalar_type() == dt && t.is_contiguous(),
                "sample: ", name, " must be a contiguous CPU vector of one ", dt, " per row");
  };
  check(rows, at::kLong, "rows");
  check(temperature, at::kFloat, "temperature");
  check(top_k, at::kLong, "top_k");
  check(top_p, at::kFloat, "top_p");
  check(min_p, at::kFloat, "min_p");
  check(u, at::kDouble, "u");
  const int64_t* row = rows.data_ptr<int64_t>();
  const float* T = temperature.data_ptr<float>();
  const float* P = top_p.data_ptr<float>();
  const float* M = min_p.data_ptr<float>();
  const int64_t* K = top_k.data_ptr<int64_t>();
  const double* U = u.data_ptr<double>();
  for (int64_t r = 0; r < N; ++r) {
    TORCH_CHECK(row[r] >= 0 && row[r] < R, "sample: row ", row[r], " outside the logits' ", R, " rows");
    TORCH_CHECK(T[r] > 0.0f && P[r] > 0.0f && P[r] <= 1.0f && M[r] >= 0.0f && M[r] <= 1.0f && U[r] >= 0.0 && U[r] < 1.0,
                "sample: row ", r, " needs temperature > 0, top_p in (0, 1], min_p in [0, 1] and u in [0, 1)");
  }
  const bool keep = kept.numel() > 0;
  TORCH_CHECK(!keep || (kept.scalar_type() == at::kFloat && kept.is_contiguous() && kept.dim() == 2 &&
                        kept.size(0) == N && kept.size(1) == V),
              "sample: kept must be empty or a contiguous float32 [N, V]");
  float* kept_rows = keep ? kept.data_ptr<float>() : nullptr;
  at::Tensor out = at::empty({N}, rows.options());
  int64_t* tok = out.data_ptr<int64_t>();
  const float* base = logits.data_ptr<float>();
  const int64_t stride = logits.stride(0);
  const SampleRow fn = row_fn(isa);
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    RowScratch s;
    for (int64_t r = begin; r < end; ++r) tok[r] = fn(base + row[r] * stride, V, {T[r], K[r], P[r], M[r], U[r]}, s, keep ? kept_rows + r * V : nullptr);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL released while rows are sampled: the server's event loop and tokenizer thread go on
  m.def("sample_rows", &sample_rows, py::call_guard<py::gil_scoped_release>(),
        "one token per row of float32 logits: temperature, top_k, top_p, min_p, inverse CDF with the row's uniform");
  m.def("supported_isas", &supported_isas, "instruction sets this CPU runs: 0 scalar, 1 avx2+fma, 2 avx512");
}
