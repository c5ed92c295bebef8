// The tile unit's restart after a gap without tile work (session 27, issue 33): one 32-token tile's int8 scores
// (24 TDPBSSD, 4 C tiles stored) after R segments of S scalar steps, each segment followed by nothing (kind 0), one
// product and its tile stored and read (4), one product and its tile stored (6); see amx_warmup.txt.
// g++ -O2 -march=sapphirerapids -o amx_warmup amx_warmup.cpp && ./amx_warmup 40 40 0
#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <unistd.h>
#include <sys/syscall.h>
struct Cfg { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; };
alignas(64) uint32_t Q[4*3*256]; alignas(64) int32_t ci[8*256]; alignas(64) int8_t A[2][16*192*2];
static inline void scores() {
  for (int part = 0; part < 2; ++part) {
    const int8_t* a0 = A[0] + part*192; const int8_t* a1 = A[1] + part*192;
    const uint32_t* qh = Q + part*2*3*256; const uint32_t* ql = qh + 3*256;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int i = 0; i < 3; ++i) {
      _tile_loadd(4, a0 + i*64, 384); _tile_loadd(6, qh + i*256, 64); _tile_loadd(7, ql + i*256, 64);
      _tile_dpbssd(0,4,6); _tile_dpbssd(1,4,7);
      _tile_loadd(5, a1 + i*64, 384); _tile_dpbssd(2,5,6); _tile_dpbssd(3,5,7);
    }
    int32_t* c = ci + part*1024;
    _tile_stored(0, c, 64); _tile_stored(1, c+256, 64); _tile_stored(2, c+512, 64); _tile_stored(3, c+768, 64);
  }
}
int main(int argc, char** argv) {
  int S = atoi(argv[1]), R = atoi(argv[2]), kind = atoi(argv[3]);
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  uint64_t ts = 0, tg = 0; const int N = 50000; volatile uint64_t sink = 0; uint64_t s = 1;
  for (int i = 0; i < N; ++i) {
    uint64_t a = __rdtsc();
    for (int rr = 0; rr < R; ++rr) {
      for (int k = 0; k < S; ++k) s = s * 6364136223846793005ull + 1442695040888963407ull;
      if (kind == 1) _tile_dpbssd(0, 4, 6);
      else if (kind == 2) _tile_zero(7);
      else if (kind == 3) _tile_loadd(7, Q, 64);
      else if (kind == 5) { _tile_stored(7, ci, 64); sink += ci[3]; }
      else if (kind == 6) { _tile_dpbssd(0, 4, 6); _tile_stored(0, ci, 64); }
      else if (kind == 4) { _tile_dpbssd(0, 4, 6); _tile_stored(0, ci, 64); sink += ci[3]; }
    }
    uint64_t b = __rdtsc();
    scores(); __m512i v = _mm512_load_si512(ci + 1792); sink += _mm512_reduce_add_epi32(v);
    uint64_t c = __rdtsc(); ts += c - b; tg += b - a;
  }
  sink += s;
  printf("S %d R %d kind %d: gap %.0f tsc (%.0f per segment), scores %.0f tsc\n", S, R, kind, double(tg)/N, double(tg)/N/R, double(ts)/N);
  _tile_release();
}
