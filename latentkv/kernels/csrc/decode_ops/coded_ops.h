// A transform-coded cache's writer, reader and the decode plan's rope-query map (coded_ops.cpp), declared
// for decode_ops.cpp (which binds the writer and the reader) and decode_step.cpp (the writer and the map).
#pragma once
#include "kernel_fns.h"
#include "plan_layer.h"
#include "torch_lite.h"

#include <cstdint>

void coded_write(at::Tensor c, at::Tensor k_r, at::Tensor cos, at::Tensor sin, at::Tensor slots, at::Tensor codes,
                 at::Tensor scales, const PlanCoded& code);

void coded_read(at::Tensor codes, at::Tensor scales, at::Tensor cos, at::Tensor sin, at::Tensor out, const PlanCoded& code);

at::Tensor coded_rope_query(const at::Tensor& q_rope, const PlanCoded& code, LinearFn linear, int64_t caps_linear);
