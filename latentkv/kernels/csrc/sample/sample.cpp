// latentkv's batched sampler (CPU): one token per row of float32 logits under each row's temperature,
// top_k, top_p and min_p, drawn by inverse CDF with the row's own uniform (sample_impl.h has the
// method). Rows run in parallel (at::parallel_for, torch's threads), each alone: its token never
// depends on the batch. Each ISA's rows are their own unit (sample_<isa>.cpp; sample_common.h).
//   sample_rows(logits [*, V] float32, rows [N] int64, temperature [N] float32, top_k [N] int64,
//               top_p [N] float32, min_p [N] float32, u [N] float64, kept, caps) -> tokens [N] int64
// kept: empty, or [N, V] float32 that gets each row's weights after truncation (the tests' view of
// the kept set and its probabilities; a row that returns early, NaN or all -inf, leaves its row as is).
#include "isa_paths.h"
#include "sample_common.h"
#include "torch_lite.h"

// The paths beside scalar (sample_<isa>.cpp), each the capabilities its unit's target needs.
constexpr int64_t NEEDS_AVX2 = CAP_AVX2, NEEDS_AVX512 = CAP_AVX2 | CAP_AVX512;
constexpr IsaPath PATHS[] = {{"avx2", NEEDS_AVX2}, {"avx512", NEEDS_AVX512}};

static SampleRow row_fn(int64_t caps) {
  if (has(caps, NEEDS_AVX512)) return isa_avx512::sample_row;
  if (has(caps, NEEDS_AVX2)) return isa_avx2::sample_row;
  return isa_scalar::sample_row;
}

static LogprobRow logprob_fn(int64_t caps) {
  if (has(caps, NEEDS_AVX512)) return isa_avx512::logprob_row;
  if (has(caps, NEEDS_AVX2)) return isa_avx2::logprob_row;
  return isa_scalar::logprob_row;
}

at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& rows, const at::Tensor& temperature,
                       const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& u,
                       const at::Tensor& kept, int64_t caps) {
  check_caps(caps, "sample");
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
  const SampleRow fn = row_fn(caps);
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    RowScratch s;
    for (int64_t r = begin; r < end; ++r) tok[r] = fn(base + row[r] * stride, V, {T[r], K[r], P[r], M[r], U[r]}, s, keep ? kept_rows + r * V : nullptr);
  });
  return out;
}

// logits [N, V] float32, ids (every row's token ids, prompt then output, one after another) int64,
// lens [N] int64 (ids a row), prompt_lens [N] int64, rep / pres / freq [N] float32 -> [N, V]: the
// logits with each row's penalties (sample_impl.h penalize_row).
at::Tensor penalize_rows(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& lens,
                         const at::Tensor& prompt_lens, const at::Tensor& rep, const at::Tensor& pres,
                         const at::Tensor& freq) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "sample: logits must be CPU float32 [N, V] with contiguous rows");
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(ids.device().is_cpu() && ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.is_contiguous(),
              "sample: ids must be a contiguous int64 CPU vector");
  for (const at::Tensor* t : {&lens, &prompt_lens})
    TORCH_CHECK(t->device().is_cpu() && t->numel() == N && t->scalar_type() == at::kLong && t->is_contiguous(),
                "sample: lens and prompt_lens must be contiguous int64 CPU vectors of one a row");
  for (const at::Tensor* t : {&rep, &pres, &freq})
    TORCH_CHECK(t->device().is_cpu() && t->numel() == N && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "sample: rep, pres and freq must be contiguous float32 CPU vectors of one a row");
  const int64_t *len = lens.data_ptr<int64_t>(), *plen = prompt_lens.data_ptr<int64_t>(), *id = ids.data_ptr<int64_t>();
  std::vector<int64_t> start(N + 1, 0);
  for (int64_t r = 0; r < N; ++r) {
    TORCH_CHECK(len[r] >= 0 && plen[r] >= 0 && plen[r] <= len[r], "sample: row ", r, "'s lengths are inconsistent");
    start[r + 1] = start[r] + len[r];
  }
  TORCH_CHECK(start[N] == ids.numel(), "sample: lens add up to ", start[N], ", ids hold ", ids.numel());
  at::Tensor out = at::empty({N, V}, logits.options());
  const float *base = logits.data_ptr<float>(), *R = rep.data_ptr<float>(), *P = pres.data_ptr<float>(),
              *F = freq.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t stride = logits.stride(0);
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> count(V, 0);
    std::vector<uint8_t> seen(V, 0);
    std::vector<int64_t> touched;
    for (int64_t r = begin; r < end; ++r)
      isa_scalar::penalize_row(base + r * stride, V, id + start[r], len[r], plen[r], R[r], P[r], F[r], o + r * V,
                               count.data(), seen.data(), touched);
  });
  return out;
}

// logits [*, V] float32, rows [N] int64, chosen [N] int64 (token ids), n (top logprobs a row, >= 0)
// -> (chosen logprob [N] float32, rank [N] int64, top values [N, n] float32, top ids [N, n] int64): the
// raw distribution's log-probabilities (log_softmax of the row), the top n by value, ties by index.
std::vector<at::Tensor> logprob_rows(const at::Tensor& logits, const at::Tensor& rows, const at::Tensor& chosen,
                                     int64_t n, int64_t caps) {
  check_caps(caps, "sample");
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "sample: logits must be CPU float32 [*, V] with contiguous rows");
  const int64_t N = rows.numel(), V = logits.size(1), R = logits.size(0);
  for (const at::Tensor* t : {&rows, &chosen})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 1 && t->numel() == N && t->scalar_type() == at::kLong &&
                    t->is_contiguous(), "sample: rows and chosen must be contiguous int64 CPU vectors of one length");
  TORCH_CHECK(n >= 0 && n <= V, "sample: n must be in [0, V]");
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t* tok = chosen.data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    TORCH_CHECK(row[r] >= 0 && row[r] < R && tok[r] >= 0 && tok[r] < V, "sample: row ", r, " or its token out of range");
  at::Tensor lp = at::empty({N}, logits.options()), rank = at::empty({N}, rows.options());
  at::Tensor vals = at::empty({N, n}, logits.options()), ids = at::empty({N, n}, rows.options());
  const LogprobRow fn = logprob_fn(caps);
  const float* base = logits.data_ptr<float>();
  float *lpp = lp.data_ptr<float>(), *vp = vals.data_ptr<float>();
  int64_t *rp = rank.data_ptr<int64_t>(), *ip = ids.data_ptr<int64_t>();
  const int64_t stride = logits.stride(0);
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(base + row[r] * stride, V, tok[r], n, vp + r * n, ip + r * n, lpp + r, rp + r);
  });
  return {lp, rank, vals, ids};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL released while rows are sampled: the server's event loop and tokenizer thread go on
  m.def("sample_rows", &sample_rows, py::call_guard<py::gil_scoped_release>(),
        "one token per row of float32 logits: temperature, top_k, top_p, min_p, inverse CDF with the row's uniform");
  m.def("penalize_rows", &penalize_rows, py::call_guard<py::gil_scoped_release>(),
        "the logits with each row's repetition, presence and frequency penalties on its seen tokens");
  m.def("logprob_rows", &logprob_rows, py::call_guard<py::gil_scoped_release>(),
        "the chosen tokens' log-probabilities and ranks, and each row's top n, of raw float32 logits");
  def_isa_paths(m, PATHS);
}
