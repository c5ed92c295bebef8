// Which instruction sets this CPU runs, for every native extension of latentkv (one place).
// Codes as kernels/build.py ISAS: 0 scalar, 1 avx2+fma, 2 avx512 (f/bw/vl/dq), 3 avx512 + bf16 + vnni.
#pragma once
#include <cstdint>
#include <vector>

inline bool isa_supported(int64_t isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (isa == 3)
    return isa_supported(2) && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
  if (isa == 2)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  if (isa == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  if (isa != 0) return false;
#endif
  return isa == 0;
}

// The codes up to `highest` (the best path an extension has) that this CPU runs.
inline std::vector<int64_t> isas_up_to(int64_t highest) {
  std::vector<int64_t> out;
  for (int64_t isa = 0; isa <= highest; ++isa)
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}
