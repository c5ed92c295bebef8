// One path's SwiGLU rows (swiglu_rows.h silu_mul_rows, compiled in that path's unit) as it hands them
// to an extension's entries (common/swiglu.h silu_mul): no torch here, so every unit may include it.
#pragma once
#include <cstdint>

struct SiluRows {
  void (*f32)(const float* gate_up, float* out, int64_t t0, int64_t t1, int64_t I);
  void (*bf16)(const uint16_t* gate_up, uint16_t* out, int64_t t0, int64_t t1, int64_t I);
};
