// What every translation unit of the sample extension shares (sample.cpp and sample_<isa>.cpp): the
// headers the ISA namespaces' rows need, one row's parameters and scratch, and each ISA's entry.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// One row's settings, as SamplingParams has them: temperature > 0; top_k 0 or >= V: off; top_p 1: off;
// min_p 0: off; u in [0, 1): the row's uniform draw, which picks the token by inverse CDF.
struct RowParams {
  float temperature;
  int64_t top_k;
  float top_p;
  float min_p;
  double u;
};

// One thread's working memory for rows of V logits (reused row after row).
struct RowScratch {
  std::vector<float> e;          // [V] e^((l - max) / T), then 0 where truncated
  std::vector<uint16_t> bucket;  // [V] each token's bucket of the histogram
  std::vector<int32_t> count;    // [BUCKETS] tokens per bucket
  std::vector<double> mass;      // [BUCKETS] their e summed
  std::vector<double> block;     // [V / BLOCK] the kept e summed per block of tokens
  std::vector<int64_t> cand;     // one bucket's tokens, in the order truncation reads them
};

// row of V float32 logits -> the token the row samples (sample_impl.h has the contract); `kept`, where
// not null, gets the row's weights after truncation [V] (e^((l - max) / T), 0 where dropped).
using SampleRow = int64_t (*)(const float* logits, int64_t V, const RowParams& p, RowScratch& s, float* kept);
// row of V float32 logits, the chosen token, n -> its log-probability and rank, the n largest (sample_impl.h)
using LogprobRow = void (*)(const float* logits, int64_t V, int64_t chosen, int64_t n, float* top_vals,
                            int64_t* top_ids, float* chosen_logprob, int64_t* rank);

namespace isa_scalar {
void penalize_row(const float* logits, int64_t V, const int64_t* ids, int64_t n_ids, int64_t n_prompt, float rep,
                  float pres, float freq, float* out, int32_t* count, uint8_t* seen, std::vector<int64_t>& touched);
int64_t sample_row(const float* logits, int64_t V, const RowParams& p, RowScratch& s, float* kept);
void logprob_row(const float* logits, int64_t V, int64_t chosen, int64_t n, float* top_vals, int64_t* top_ids,
                 float* chosen_logprob, int64_t* rank);
}
namespace isa_avx2 {
void penalize_row(const float* logits, int64_t V, const int64_t* ids, int64_t n_ids, int64_t n_prompt, float rep,
                  float pres, float freq, float* out, int32_t* count, uint8_t* seen, std::vector<int64_t>& touched);
int64_t sample_row(const float* logits, int64_t V, const RowParams& p, RowScratch& s, float* kept);
void logprob_row(const float* logits, int64_t V, int64_t chosen, int64_t n, float* top_vals, int64_t* top_ids,
                 float* chosen_logprob, int64_t* rank);
}
namespace isa_avx512 {
void penalize_row(const float* logits, int64_t V, const int64_t* ids, int64_t n_ids, int64_t n_prompt, float rep,
                  float pres, float freq, float* out, int32_t* count, uint8_t* seen, std::vector<int64_t>& touched);
int64_t sample_row(const float* logits, int64_t V, const RowParams& p, RowScratch& s, float* kept);
void logprob_row(const float* logits, int64_t V, int64_t chosen, int64_t n, float* top_vals, int64_t* top_ids,
                 float* chosen_logprob, int64_t* rank);
}
