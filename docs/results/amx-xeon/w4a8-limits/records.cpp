// The w4a8 record kernels' cost per record, apart from memory (see README.md): the VNNI loop as
// qlinear_dot_vnni.h runs it, the same over records stored already transposed, and AMX int8 tiles
// of R rows (TDPBSUD, B = the widened record) with the format's per-group float steps.
// g++ -O2 -march=sapphirerapids records.cpp -o records && ./records
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <chrono>
#include <unistd.h>
#include <sys/syscall.h>
struct Cfg { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static void cfg(int rows){ Cfg c{}; c.palette=1; c.rows[0]=c.rows[3]=rows; c.colsb[0]=c.colsb[3]=64; c.rows[1]=rows; c.colsb[1]=32; c.rows[2]=8; c.colsb[2]=64; asm volatile(""::"m"(c):"memory"); _tile_loadconfig(&c);}
static inline void w4_chunks(const uint8_t* rec, __m512i lo[4], __m512i hi[4]) {
  const __m512i pick = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
  const __m512i two = _mm512_set1_epi32(2), m4 = _mm512_set1_epi8(15);
  __m512i a[2], b[2];
  for (int h = 0; h < 2; ++h) {
    const __m512i v0 = _mm512_loadu_si512(rec + 128 * h), v1 = _mm512_loadu_si512(rec + 128 * h + 64);
    a[h] = _mm512_permutex2var_epi32(v0, pick, v1);
    b[h] = _mm512_permutex2var_epi32(v0, _mm512_add_epi32(pick, two), v1);
  }
  const __m512i t[4] = {_mm512_shuffle_i64x2(a[0], a[1], 0x44), _mm512_shuffle_i64x2(a[0], a[1], 0xee),
                        _mm512_shuffle_i64x2(b[0], b[1], 0x44), _mm512_shuffle_i64x2(b[0], b[1], 0xee)};
  for (int d = 0; d < 4; ++d) lo[d] = _mm512_and_si512(t[d], m4), hi[d] = _mm512_and_si512(_mm512_srli_epi16(t[d], 4), m4);
}
const int G=32, NB=64; // one expert gate_up: 64 blocks x 32 groups
std::vector<uint8_t> W(NB*G*320); std::vector<int8_t> X(16*G*32, 3); std::vector<float> xd(16*G,0.1f), xs(16*G,0.2f); float out[16][16*NB];
template<int R> void vnni(){
  for(int blk=0;blk<NB;++blk){ __m512 tot[R]; for(int t=0;t<R;++t) tot[t]=_mm512_setzero_ps();
    for(int g=0; g<G; ++g){ const uint8_t* rec=W.data()+(blk*G+g)*320; __m512i lo[4],hi[4]; w4_chunks(rec,lo,hi);
      const __m512 sc=_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec+256))), mn=_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec+288)));
      for(int t=0;t<R;++t){ const int8_t* x=X.data()+t*G*32+g*32; __m512i l=_mm512_setzero_si512(), h=_mm512_setzero_si512();
        for(int d=0;d<4;++d){ int32_t v0,v1; memcpy(&v0,x+4*d,4); memcpy(&v1,x+16+4*d,4); l=_mm512_dpbusd_epi32(l,lo[d],_mm512_set1_epi32(v0)); h=_mm512_dpbusd_epi32(h,hi[d],_mm512_set1_epi32(v1)); }
        const __m512 is=_mm512_cvtepi32_ps(_mm512_add_epi32(l,h)); tot[t]=_mm512_fmadd_ps(is,_mm512_mul_ps(sc,_mm512_set1_ps(xd[t*G+g])),tot[t]); tot[t]=_mm512_fmadd_ps(mn,_mm512_set1_ps(xs[t*G+g]),tot[t]); } }
    for(int t=0;t<R;++t) _mm512_storeu_ps(out[t]+blk*16, tot[t]); }
}
static inline void w4_pre(const uint8_t* rec, __m512i lo[4], __m512i hi[4]) {
  const __m512i m4 = _mm512_set1_epi8(15);
  for (int d = 0; d < 4; ++d) { const __m512i t = _mm512_loadu_si512(rec + 64 * d); lo[d] = _mm512_and_si512(t, m4), hi[d] = _mm512_and_si512(_mm512_srli_epi16(t, 4), m4); }
}
template<int R> void vnni_pre(){
  for(int blk=0;blk<NB;++blk){ __m512 tot[R]; for(int t=0;t<R;++t) tot[t]=_mm512_setzero_ps();
    for(int g=0; g<G; ++g){ const uint8_t* rec=W.data()+(blk*G+g)*320; __m512i lo[4],hi[4]; w4_pre(rec,lo,hi);
      const __m512 sc=_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec+256))), mn=_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec+288)));
      for(int t=0;t<R;++t){ const int8_t* x=X.data()+t*G*32+g*32; __m512i l=_mm512_setzero_si512(), h=_mm512_setzero_si512();
        for(int d=0;d<4;++d){ int32_t v0,v1; memcpy(&v0,x+4*d,4); memcpy(&v1,x+16+4*d,4); l=_mm512_dpbusd_epi32(l,lo[d],_mm512_set1_epi32(v0)); h=_mm512_dpbusd_epi32(h,hi[d],_mm512_set1_epi32(v1)); }
        const __m512 is=_mm512_cvtepi32_ps(_mm512_add_epi32(l,h)); tot[t]=_mm512_fmadd_ps(is,_mm512_mul_ps(sc,_mm512_set1_ps(xd[t*G+g])),tot[t]); tot[t]=_mm512_fmadd_ps(mn,_mm512_set1_ps(xs[t*G+g]),tot[t]); } }
    for(int t=0;t<R;++t) _mm512_storeu_ps(out[t]+blk*16, tot[t]); }
}
template<int R> void amx(){
  alignas(64) uint8_t b[512]; alignas(64) int32_t c[16][16];
  for(int blk=0;blk<NB;++blk){ __m512 tot[R]; for(int t=0;t<R;++t) tot[t]=_mm512_setzero_ps();
    for(int g=0; g<G; ++g){ const uint8_t* rec=W.data()+(blk*G+g)*320; __m512i lo[4],hi[4]; w4_chunks(rec,lo,hi);
      for(int d=0;d<4;++d){ _mm512_store_si512(b+64*d, lo[d]); _mm512_store_si512(b+256+64*d, hi[d]); }
      _tile_zero(0); _tile_loadd(1, X.data()+g*32, G*32); _tile_loadd(2, b, 64); _tile_dpbsud(0,1,2); _tile_stored(0, c, 64);
      const __m512 sc=_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec+256))), mn=_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec+288)));
      for(int t=0;t<R;++t){ const __m512 is=_mm512_cvtepi32_ps(_mm512_load_si512(c[t])); tot[t]=_mm512_fmadd_ps(is,_mm512_mul_ps(sc,_mm512_set1_ps(xd[t*G+g])),tot[t]); tot[t]=_mm512_fmadd_ps(mn,_mm512_set1_ps(xs[t*G+g]),tot[t]); } }
    for(int t=0;t<R;++t) _mm512_storeu_ps(out[t]+blk*16, tot[t]); }
}
template<class F> double bench(F f){ f(); double best=1e9; for(int k=0;k<7;++k){auto t0=std::chrono::steady_clock::now(); for(int r=0;r<20;++r) f(); auto t1=std::chrono::steady_clock::now(); best=std::min(best,std::chrono::duration<double>(t1-t0).count()/20*1e9/(NB*G));} return best; }
int main(){ syscall(SYS_arch_prctl, 0x1023, 18);  // ARCH_REQ_XCOMP_PERM for the AMX tile data
  for(auto& v: W) v = rand();
  for(int i=0;i<NB*G;++i){ uint16_t h=0x3c00; memcpy(&W[i*320+256], &h, 2);}
  printf("ns per record (16 outputs x 32 inputs) at R activation rows, one thread, data in L1/L2\n");
  printf("R  vnni (record as packed)  vnni (record pre-transposed)  amx int8 (R-row tiles)\n");
  const int rs[] = {1, 2, 3, 4, 8, 16};
  for (int r : rs) {
    double a = 0, b = 0, c = 0;
    switch (r) {
#define ROW(R) case R: a = bench(vnni<R>); b = bench(vnni_pre<R>); cfg(R); c = bench(amx<R>); break;
      ROW(1) ROW(2) ROW(3) ROW(4) ROW(8) ROW(16)
    }
    printf("%-2d %24.1f %29.1f %23.1f\n", r, a, b, c);
  }
  _tile_release();
}
