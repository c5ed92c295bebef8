// Which instruction sets this CPU runs, for every native extension of latentkv (one place).
// Codes as kernels/build.py ISAS: 0 scalar, 1 avx2+fma, 2 avx512 (f/bw/vl/dq), 3 avx512 + bf16 + vnni,
// 4 amx (3 with AMX tiles and bf16 tile products, and the kernel's leave to use the tile state).
// avx512_vnni alone (Cascade Lake, Ice Lake: no avx512_bf16) is no code of its own: a kernel with a
// VNNI path serves it from code 2 where `has_avx512_vnni()` (qlinear's integer-dot linears).
#pragma once
#include <cstdint>
#include <vector>
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif

// Linux hands a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA, kernel 5.16+); without it the first tile instruction faults. Asked once.
inline bool amx_permitted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
#else
  return false;
#endif
}

inline bool isa_supported(int64_t isa);

// Code 2 and avx512_vnni's vpdpbusd (u8 x s8 -> s32 dot products of four).
inline bool has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return isa_supported(2) && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

inline bool isa_supported(int64_t isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (isa == 4)
    return isa_supported(3) && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") && amx_permitted();
  if (isa == 3) return has_avx512_vnni() && __builtin_cpu_supports("avx512bf16");
  if (isa == 2)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  if (isa == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  if (isa != 0) return false;
#endif
  return isa == 0;
}

// Code 4 and amx_int8's int8 tile products (every CPU with amx_bf16 so far has it too; asked anyway).
inline bool has_amx_int8() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return isa_supported(4) && __builtin_cpu_supports("amx-int8");
#else
  return false;
#endif
}

// The codes up to `highest` (the best path an extension has) that this CPU runs.
inline std::vector<int64_t> isas_up_to(int64_t highest) {
  std::vector<int64_t> out;
  for (int64_t isa = 0; isa <= highest; ++isa)
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}
