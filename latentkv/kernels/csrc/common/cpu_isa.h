// The capabilities a kernel path may require, each a name with a bit (no order among them), and which
// of them this CPU has: one place for every native extension of latentkv. A path requires a set of them
// (a mask, `needs`); every kernel entry takes the set that serves (`caps`, chosen once by
// kernels/build.py: this CPU's, less what LATENTKV_CPU_ISA or the self-check leaves out) and runs a
// path where `has(caps, needs)`. A path for another architecture (NEON, SVE) is one more name here and
// one more test in the kernels, beside the others, not above them.
#pragma once
#include <cstdint>
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif

// The names kernels/build.py CAPS lists, in bit order (tests/kernels/test_kernels_build.py compares them).
constexpr int64_t CAP_AVX2 = 1 << 0;         // avx2 + fma (and f16c, which every such CPU has)
constexpr int64_t CAP_AVX512 = 1 << 1;       // avx512 f, bw, vl, dq + fma
constexpr int64_t CAP_AVX512_VNNI = 1 << 2;  // vpdpbusd: u8 x s8 -> s32 dot products of four
constexpr int64_t CAP_AVX512_BF16 = 1 << 3;  // vdpbf16ps: bf16 pairs -> float32
constexpr int64_t CAP_AMX_BF16 = 1 << 4;     // amx_tile + amx_bf16 tiles, and the kernel's leave to use them
constexpr int64_t CAP_AMX_INT8 = 1 << 5;     // amx_tile + amx_int8 tiles, and the kernel's leave to use them

struct CapName {
  const char* name;
  int64_t bit;
};
constexpr CapName CAP_NAMES[] = {{"avx2", CAP_AVX2},         {"avx512", CAP_AVX512},     {"avx512_vnni", CAP_AVX512_VNNI},
                                 {"avx512_bf16", CAP_AVX512_BF16}, {"amx_bf16", CAP_AMX_BF16}, {"amx_int8", CAP_AMX_INT8}};

// A path runs where the capabilities that serve include every one it needs.
inline bool has(int64_t caps, int64_t needs) { return (caps & needs) == needs; }

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

// The capabilities this CPU has (cpuinfo, and the kernel's leave for AMX), each on its own.
inline int64_t cpu_caps() {
  int64_t caps = 0;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) caps |= CAP_AVX2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma"))
    caps |= CAP_AVX512;
  if (__builtin_cpu_supports("avx512vnni")) caps |= CAP_AVX512_VNNI;
  if (__builtin_cpu_supports("avx512bf16")) caps |= CAP_AVX512_BF16;
  const bool tiles = __builtin_cpu_supports("amx-tile");
  if (tiles && __builtin_cpu_supports("amx-bf16") && amx_permitted()) caps |= CAP_AMX_BF16;
  if (tiles && __builtin_cpu_supports("amx-int8") && amx_permitted()) caps |= CAP_AMX_INT8;
#endif
  return caps;
}

// Whether this CPU runs every capability of `caps` (an entry's argument check; a negative mask has bits
// no capability has).
inline bool cpu_runs(int64_t caps) {
  static const int64_t here = cpu_caps();
  return has(here, caps);
}
