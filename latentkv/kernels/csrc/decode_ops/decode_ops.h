// The fused decode-step ops of decode_ops.cpp (shapes and meaning there), declared for
// decode_step.cpp, which calls them between the weight linears. caps: the capabilities that serve (cpu_isa.h).
#pragma once
#include "torch_lite.h"

#include <cstdint>
#include <vector>

at::Tensor head_matmul(at::Tensor x, at::Tensor w, double scale, at::Tensor extra, int64_t caps, at::Tensor packed);
at::Tensor head_pack(at::Tensor w, int64_t caps);
at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin, bool interleaved, int64_t caps, at::Tensor slots);
void write_latent(at::Tensor c, at::Tensor k_r, at::Tensor cos, at::Tensor sin, bool interleaved,
                  at::Tensor slots, at::Tensor kv, at::Tensor latent, at::Tensor scale, at::Tensor rope_cache,
                  double qmax, int64_t caps);
std::vector<at::Tensor> rms_norm(at::Tensor x, at::Tensor weight, double eps, at::Tensor residual, int64_t caps);
at::Tensor silu_mul(at::Tensor gate_up, int64_t caps);
