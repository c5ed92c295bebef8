// bf16 <-> float32 (and float16 -> float32) for scalar code at file scope (the ISA namespaces'
// vector loops keep their own, NaN-free, forms beside their kernels).
#pragma once
#include <cstdint>
#include <cstring>

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as torch does; NaN stays a quiet NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// float16 bits -> float32, subnormals included (no inf / NaN: a q4_0 cache scale is finite).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 31u, man = h & 1023u;
  if (exp == 0) {
    const float f = (float)man * 5.9604644775390625e-8f;  // man * 2^-24
    return sign ? -f : f;
  }
  const uint32_t u = sign | ((exp + 112u) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
