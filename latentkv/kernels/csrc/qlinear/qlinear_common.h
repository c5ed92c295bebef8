// What every translation unit of the qlinear extension shares (qlinear.cpp and qlinear_<isa>.cpp):
// the headers the ISA namespaces' kernels need, a few helpers they call, and the interface by which
// qlinear.cpp's entries reach the kernels of another unit (qlinear_paths.h).
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include "cpu_isa.h"
#include "qlinear_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

// The integer-dot kinds (qlinear_dot_impl.h) scale weights and activations per group: 32 inputs for w4a8
// and w8a8 (kinds 104, 108), 128 for w4a8_g128 (114), whose records hold a group's codes as four
// sub-blocks of 32 in the 32-input layout. A group's integer sum is exact in int32 (at most 128 x 15 x
// 127), so its float steps run once per group: per 128 inputs a quarter as many, and a C tile on AMX
// sums two 64-deep products before its one store (qlinear_amx_int8.cpp).
constexpr int DOT_SUB = 32;  // inputs per sub-block of a record

// A record's scales (and mins) at byte offset `at`: float16 (w4a8) or float32 (w8a8).
static inline const uint16_t* halves(const uint8_t* rec, int at) { return reinterpret_cast<const uint16_t*>(rec + at); }
static inline const float* floats(const uint8_t* rec, int at) { return reinterpret_cast<const float*>(rec + at); }

// The integer-dot formats that read a record's codes where they lie (qlinear_dot_impl.h's Codes):
// isum gets the record and the first of its rows.
struct CodesInPlace {
  struct Codes {
    const uint8_t* rec;
    int lane;
  };
  static inline Codes codes(const uint8_t* rec, int lane) { return {rec, lane}; }
};

// IEEE half -> float, exact (the scalar path's twin of vcvtph2ps): subnormals as mantissa * 2^-24.
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return sign ? -(float)man * 0x1p-24f : (float)man * 0x1p-24f;
  const uint32_t bits = exp == 31 ? 0x7f800000u | man << 13 : (exp + 112) << 23 | man << 13;
  return __builtin_bit_cast(float, sign | bits);
}

// quantize_group's answer (every ISA) for a group holding a NaN: codes 0, sum 0, max|v| NaN, so
// d_x and s_x are NaN and the NaN reaches every output of the row, as in a float linear.
static inline float nan_group(int8_t* q, int32_t* sum, int n) {
  for (int j = 0; j < n; ++j) q[j] = 0;
  *sum = 0;
  return __builtin_nanf("");
}
