// One 16-row x 16-output tile of w4a8 on AMX int8 per group of 32 inputs: the tile products alone
// (zero, load A, load B, TDPBSUD, store), the format's float steps alone (per row: cvt, d_w * d_x, two
// fma), and both, in batches and software-pipelined (see README.md). 192 blocks x 24 groups a call.
// g++ -O2 -march=sapphirerapids tiles_vs_vectors.cpp -o tiles && ./tiles
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <chrono>
#include <unistd.h>
#include <sys/syscall.h>
struct Cfg { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static void cfg(int rows){ Cfg c{}; c.palette=1; for(int t: {0,3,4,5}){c.rows[t]=rows;c.colsb[t]=64;} c.rows[1]=rows; c.colsb[1]=32; c.rows[2]=8; c.colsb[2]=64; c.rows[6]=rows; c.colsb[6]=32; c.rows[7]=8; c.colsb[7]=64; asm volatile(""::"m"(c):"memory"); _tile_loadconfig(&c);}
const int G=24, NB=192;
std::vector<int8_t> x(16*G*32, 3); std::vector<uint8_t> b(G*512, 5); std::vector<float> dw(G*16,1.f), mw(G*16,0.5f), xd(16*G, 0.1f), xs(16*G, 0.2f);
float sink[16][16];
alignas(64) int32_t c[8][16][16];
static inline void fl(__m512* tot, int g, const int32_t (*cg)[16]) {
  const __m512 d_w=_mm512_loadu_ps(dw.data()+g*16), m_w=_mm512_loadu_ps(mw.data()+g*16);
  #pragma GCC unroll 16
  for(int t=0;t<16;++t){ const __m512 is=_mm512_cvtepi32_ps(_mm512_load_si512(cg[t])); tot[t]=_mm512_fmadd_ps(is,_mm512_mul_ps(d_w,_mm512_set1_ps(xd[t*G+g])),tot[t]); tot[t]=_mm512_fmadd_ps(m_w,_mm512_set1_ps(xs[t*G+g]),tot[t]); }
}
#define TG(T, g, slot) do { _tile_zero(T); _tile_loadd(1, x.data()+(g)*32, G*32); _tile_loadd(2, b.data()+(g)*512, 64); _tile_dpbsud(T,1,2); } while(0)
template<int MODE>
void run(){
  for(int blk=0; blk<NB; ++blk){
    __m512 tot[16]; for(int t=0;t<16;++t) tot[t]=_mm512_setzero_ps();
    if (MODE==3) { // batches of 4: tile ops for 4 groups, store, float for them
      for(int g=0; g<G; g+=4){
        TG(0,g,0); TG(3,g+1,1); TG(4,g+2,2); TG(5,g+3,3);
        _tile_stored(0,c[0],64); _tile_stored(3,c[1],64); _tile_stored(4,c[2],64); _tile_stored(5,c[3],64);
        for(int j=0;j<4;++j) fl(tot,g+j,c[j]);
      }
    } else if (MODE==4) { // pipelined batches of 4
      TG(0,0,0); TG(3,1,1); TG(4,2,2); TG(5,3,3);
      _tile_stored(0,c[0],64); _tile_stored(3,c[1],64); _tile_stored(4,c[2],64); _tile_stored(5,c[3],64);
      for(int g=0; g<G; g+=4){
        const int nb = ((g/4)+1)&1, cb = (g/4)&1;
        if (g+4<G){ TG(0,g+4,0); TG(3,g+5,1); TG(4,g+6,2); TG(5,g+7,3);
          _tile_stored(0,c[4*nb],64); _tile_stored(3,c[4*nb+1],64); _tile_stored(4,c[4*nb+2],64); _tile_stored(5,c[4*nb+3],64);}
        for(int j=0;j<4;++j) fl(tot,g+j,c[4*cb+j]);
      }
    } else if (MODE==5) { // pipelined, stores after float
      TG(0,0,0); TG(3,1,1); TG(4,2,2); TG(5,3,3);
      for(int g=0; g<G; g+=4){
        const int cb = (g/4)&1;
        _tile_stored(0,c[4*cb],64); _tile_stored(3,c[4*cb+1],64); _tile_stored(4,c[4*cb+2],64); _tile_stored(5,c[4*cb+3],64);
        if (g+4<G){ TG(0,g+4,0); TG(3,g+5,1); TG(4,g+6,2); TG(5,g+7,3);}
        for(int j=0;j<4;++j) fl(tot,g+j,c[4*cb+j]);
      }
    } else if (MODE==6) { // tile ops only batches of 4
      for(int g=0; g<G; g+=4){
        TG(0,g,0); TG(3,g+1,1); TG(4,g+2,2); TG(5,g+3,3);
        _tile_stored(0,c[0],64); _tile_stored(3,c[1],64); _tile_stored(4,c[2],64); _tile_stored(5,c[3],64);
      }
    } else if (MODE==7) { // float only
      for(int g=0; g<G; ++g) fl(tot,g,c[g&7]);
    }
    for(int t=0;t<16;++t) _mm512_storeu_ps(sink[t], _mm512_add_ps(tot[t], _mm512_loadu_ps(sink[t])));
  }
}
template<int MODE> double bench(){ run<MODE>(); double best=1e9; for(int k=0;k<5;++k){auto t0=std::chrono::steady_clock::now(); for(int r=0;r<20;++r) run<MODE>(); auto t1=std::chrono::steady_clock::now(); best=std::min(best,std::chrono::duration<double>(t1-t0).count()/20*1e6);} return best; }
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg(16);
  printf("tile only x4: %.1f us\n", bench<6>());
  printf("float only: %.1f us\n", bench<7>());
  printf("batch4: %.1f us\n", bench<3>());
  printf("pipelined4: %.1f us\n", bench<4>());
  printf("pipelined4 store-late: %.1f us\n", bench<5>());
  _tile_release();
}
