// How qlinear.cpp's entries run a packed linear, at file scope after its scalar namespace (the other
// ISAs' kernels reach it through qlinear_paths.h): the kernel
// of a record kind on an instruction set for x's dtype (`Kernel`), x in the form that kernel reads
// (`Act`, `Kernel::prepare`), and the output in work units (`Kernel::units`, `Kernel::run`). The
// `linear` entry runs one linear's units over the threads; the MoE op (moe.h) runs the units of
// many linears (its experts') as the items of one parallel region. Every output element reduces in
// its kind's fixed order whatever units a call runs (qlinear_impl.h, qlinear_dot_impl.h).
#pragma once
#include "torch_lite.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr float kInvPow16[7] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f};

// x [M, K] float32 / bf16 as float32 rows of Kp (zeros past K), x itself where it already is one.
at::Tensor float_rows(const at::Tensor& x, int64_t Kp) {
  const int64_t M = x.size(0), K = x.size(1);
  if (x.scalar_type() == at::kFloat && K == Kp && x.stride(1) == 1 && x.stride(0) >= Kp) return x;
  at::Tensor xf = at::empty({M, Kp}, x.options().dtype(at::kFloat));
  float* dst = xf.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "qlinear_x", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    const int64_t s0 = x.stride(0), s1 = x.stride(1);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < Kp; ++k) dst[m * Kp + k] = k < K ? (float)src[m * s0 + k * s1] : 0.0f;
  });
  return xf;
}

// x [M, K] bf16 -> int32 [Mp, Kp / 2]: word j holds inputs 2j (low half) and 2j + 1 (zeros past K),
// the operand of vdpbf16ps and of the AMX tiles. Mp >= M rows (AMX's whole 16-row tiles: rows past M
// are zeros).
at::Tensor pair_rows(const at::Tensor& x, int64_t Kp, int64_t Mp = -1) {
  const int64_t M = x.size(0), K = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  Mp = std::max(Mp, M);
  at::Tensor out = at::empty({Mp, Kp / 2}, x.options().dtype(at::kInt));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  uint32_t* dst = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  std::fill(dst + M * (Kp / 2), dst + Mp * (Kp / 2), 0u);
  if (K == Kp && s1 == 1) {  // a row's bf16 pairs are its words already (little-endian)
    for (int64_t m = 0; m < M; ++m) std::copy(src + m * s0, src + m * s0 + K, reinterpret_cast<uint16_t*>(dst + m * (Kp / 2)));
    return out;
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < Kp / 2; ++j) {
      const uint32_t lo = 2 * j < K ? src[m * s0 + 2 * j * s1] : 0, hi = 2 * j + 1 < K ? src[m * s0 + (2 * j + 1) * s1] : 0;
      dst[m * (Kp / 2) + j] = lo | hi << 16;
    }
  return out;
}

// x [M, K] as a kernel reads it (Kernel::prepare), one row per row of x:
//   float32 rows [M, Kp] (int4: input k times 16^-(k % 8) (qlinear_impl.h), `sums` each group's sum of x [M, G]);
//   words of two bf16 [Mp, Kp / 2] (vdpbf16ps; AMX: Mp whole 16-row tiles);
//   int8 codes [M, Kp] with `sums` d_x, `sx` s_x [M, G] and `qsum` the codes' sums [M, G] int32 (the
//   integer-dot kinds, qlinear_dot_impl.h).
struct Act {
  at::Tensor rows, sums, sx, qsum;
  const int32_t* head = nullptr;  // AMX's linear entry: rows below M16 read in place from x (stride ldh words)
  int64_t ldh = 0, M16 = 0;
};

// The kernel of record kind 4, 8, 16, 32 (qlinear_impl.h) or 104, 108 (int8 activations times int4 /
// int8 weights: qlinear_dot_impl.h) on the best path `caps` allows (qlinear_paths.h) for x in bf16 (bf16_x)
// or float32.
struct Kernel {
  int64_t kind, caps;
  bool bf16_x;
  Units units_fn = nullptr;
  DotUnits dot_fn = nullptr;
  Count count = nullptr;
  Quantize quantize = nullptr;

  Kernel(int64_t kind_, int64_t caps_, bool bf16_x_) : kind(kind_), caps(caps_), bf16_x(bf16_x_) {
    TORCH_CHECK(kind == 4 || kind == 8 || kind == 16 || kind == 32 || dot(),
                "qlinear: kind must be 4, 8, 16, 32, 104, 108 or 114, got ", kind);
    if (dot()) {  // AVX-512 without VNNI (Skylake) runs the AVX2 path
      const DotPath path = vnni()                        ? isa_avx512vnni::dot_path()
                           : has(caps, NEEDS_AVX2) ? isa_avx2::dot_path()
                                                   : isa_scalar::dot_path();
      dot_fn = kind == 104 ? path.w4 : kind == 114 ? path.w4g : path.w8, count = path.count, quantize = path.quantize;
    } else if (amx()) {
      count = [](int64_t, int64_t N) { return isa_amx::unit_count(N); };
    } else {  // pairs(): bf16 rows times bf16 weights by vdpbf16ps
      const LinearPath path = pairs()                       ? isa_avx512bf16::linear_path()
                              : has(caps, NEEDS_AVX512) ? isa_avx512::linear_path()
                              : has(caps, NEEDS_AVX2)   ? isa_avx2::linear_path()
                                                        : isa_scalar::linear_path();
      units_fn = kind == 4 ? path.int4 : kind == 8 ? path.int8 : kind == 16 ? path.bf16 : path.f32;
      count = path.count;
    }
  }

  bool dot() const { return kind == 104 || kind == 108 || kind == 114; }
  bool vnni() const { return dot() && has(caps, NEEDS_AVX512_VNNI); }  // the integer sums by vpdpbusd
  // the integer-dot kinds' path (the constructor's choice, by name)
  const char* dot_path() const { return vnni() ? "avx512_vnni" : has(caps, NEEDS_AVX2) ? "avx2" : "scalar"; }
  bool amx() const { return has(caps, NEEDS_AMX_BF16) && kind == 16 && bf16_x; }  // AMX tiles (qlinear_amx.cpp)
  // w4a8 products of many rows on AMX int8 tiles (qlinear_amx_int8.cpp: the VNNI path's bits)
  bool amx_dot(int64_t M) const {
    return (kind == 104 || kind == 114) && has(caps, NEEDS_AMX_INT8) && M >= isa_amx::AMX_DOT_ROWS;
  }
  bool pairs() const { return has(caps, NEEDS_AVX512_BF16) && kind == 16 && bf16_x; }  // x as words of two bf16
  // words per record of the packed weight
  int64_t rec() const {
    return kind == 4 ? isa_scalar::Int4::REC : kind == 8 ? isa_scalar::Int8::REC : kind == 16 ? isa_scalar::BF16::REC
           : kind == 32 ? isa_scalar::F32::REC : kind == 104 ? isa_scalar::W4::REC / 4
           : kind == 114 ? isa_scalar::W4G::REC / 4 : isa_scalar::W8::REC / 4;
  }
  // inputs per group of the packed weight (its records: one per 16 outputs and group)
  int64_t group() const { return kind == 114 ? 4 * DOT_SUB : 32; }
  // what `run` writes: float32, or bf16 (the AMX tiles round once, inside)
  at::ScalarType out_type() const { return amx() ? at::kBFloat16 : at::kFloat; }
  int64_t units(int64_t M, int64_t N) const { return count(M, N); }

  // x [M, K] float32 / bf16 (K <= G * group()) -> its Act. in_place: AMX may read whole tiles of x where they lie.
  Act prepare(const at::Tensor& x, int64_t G, bool in_place) const {
    const int64_t M = x.size(0), Kp = G * group();
    Act a;
    if (amx()) {
      // rows whose 32-bit words are already the pairs (contiguous inputs, whole groups) are read in
      // place in whole tiles; the rest (or all, otherwise) copied as pair words with zero rows to 16
      const bool whole = in_place && x.size(1) == Kp && x.stride(1) == 1 && x.stride(0) % 2 == 0 &&
                         reinterpret_cast<uintptr_t>(x.data_ptr()) % 4 == 0;
      a.M16 = whole ? M / 16 * 16 : 0;
      a.head = reinterpret_cast<const int32_t*>(x.data_ptr()), a.ldh = x.stride(0) / 2;
      a.rows = pair_rows(x.narrow(0, a.M16, M - a.M16), Kp, (M - a.M16 + 15) / 16 * 16);
      return a;
    }
    if (pairs()) {
      a.rows = pair_rows(x, Kp);
      return a;
    }
    const at::Tensor xf = float_rows(x, Kp);
    const float* xp = xf.data_ptr<float>();
    const int64_t ldx = xf.stride(0);
    if (dot()) {
      a.rows = at::empty({M, Kp}, x.options().dtype(at::kChar));
      a.sums = at::empty({M, G}, x.options().dtype(at::kFloat)), a.sx = at::empty({M, G}, x.options().dtype(at::kFloat));
      a.qsum = at::empty({M, G}, x.options().dtype(at::kInt));
      quantize(xp, ldx, M, G, group(), a.rows.data_ptr<int8_t>(), a.sums.data_ptr<float>(), a.sx.data_ptr<float>(),
               a.qsum.data_ptr<int32_t>());
    } else if (kind == 4) {
      // each row's sum per group (in input order: a fixed order per row) for the min term, and
      // x' = x * 16^-(k % 8) (k % 8 < 7) for the in-place nibbles (qlinear_impl.h)
      a.rows = at::empty({M, Kp}, x.options().dtype(at::kFloat)), a.sums = at::empty({M, G}, x.options().dtype(at::kFloat));
      float *xs = a.rows.data_ptr<float>(), *xsum = a.sums.data_ptr<float>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t g = 0; g < G; ++g) {
          float s = 0.0f;
          for (int64_t k = 0; k < 32; ++k) {
            const float v = xp[m * ldx + g * 32 + k];
            s += v;
            xs[m * Kp + g * 32 + k] = (k & 7) == 7 ? v : v * kInvPow16[k & 7];
          }
          xsum[m * G + g] = s;
        }
    } else {
      a.rows = xf;
    }
    return a;
  }

  // a's rows from m0 on as isa_amx::units reads them: those read in place (head, below M16: whole 16-row
  // tiles) and the copied ones (tail). A start below M16 must be a whole tile's.
  struct AmxRows {
    const int32_t* head;
    int64_t M16;
    const int32_t* tail;
  };
  AmxRows amx_rows(const Act& a, int64_t m0) const {
    TORCH_CHECK(m0 >= a.M16 || m0 % 16 == 0, "qlinear: AMX rows read in place start at a whole tile, got row ", m0);
    return {a.head + m0 * a.ldh, std::max<int64_t>(0, a.M16 - m0),
            a.rows.data_ptr<int32_t>() + std::max<int64_t>(0, m0 - a.M16) * a.rows.stride(0)};
  }

  // SwiGLU units u0..u1 (amx_unit_count(N, true)) of out [M, N] bf16 = silu(gate) * up of rows m0 .. m0 + M
  // of a times a [gate; up] weight of 2N rows (amx() only; N a multiple of 16).
  void run_swiglu(const int32_t* packed, int64_t G, const Act& a, int64_t m0, int64_t M, uint16_t* out, int64_t N,
                  int64_t u0, int64_t u1) const {
    const AmxRows r = amx_rows(a, m0);
    isa_amx::units(packed, G, r.head, M, a.ldh, r.M16, r.tail, a.rows.stride(0), out, N, N, u0, u1, true);
  }

  // Units u0..u1 of out [M, N] (stride ldo, of out_type()) = rows m0 .. m0 + M of a times the packed
  // weight (G groups a row).
  void run(const int32_t* packed, int64_t G, const Act& a, int64_t m0, int64_t M, void* out, int64_t ldo, int64_t N,
           int64_t u0, int64_t u1) const {
    const int64_t ld = a.rows.stride(0);
    if (dot()) {
      const DotUnits fn = !amx_dot(M) ? dot_fn : kind == 114 ? isa_amx::dot_w4g_units : isa_amx::dot_w4_units;  // same bits
      fn(reinterpret_cast<const uint8_t*>(packed), G, a.rows.data_ptr<int8_t>() + m0 * ld, M, ld,
             a.sums.data_ptr<float>() + m0 * G, a.sx.data_ptr<float>() + m0 * G, a.qsum.data_ptr<int32_t>() + m0 * G,
             static_cast<float*>(out), ldo, N, u0, u1);
    } else if (amx()) {
      const AmxRows r = amx_rows(a, m0);
      isa_amx::units(packed, G, r.head, M, a.ldh, r.M16, r.tail, ld, static_cast<uint16_t*>(out), ldo, N, u0, u1, false);
    } else {
      static const float none = 0.0f;  // xsum of the kinds without a min term: never read
      const float* x = pairs() ? reinterpret_cast<const float*>(a.rows.data_ptr<int32_t>()) : a.rows.data_ptr<float>();
      units_fn(packed, G, x + m0 * ld, M, ld, kind == 4 ? a.sums.data_ptr<float>() + m0 * G : &none,
               static_cast<float*>(out), ldo, N, u0, u1);
    }
  }
};

}  // namespace
