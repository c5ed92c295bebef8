// Reading random 3 KB blocks (a 16-token block of the int8 latent and of the int8 rope key, 150 MB in all) on 2
// threads, with W dependent FMAs (~4 cycles each) after each block pair and software prefetch of block i + D (strategy 1:
// every line to L2): what the decode kernel's memory could deliver (session 27, issue 33); see random_blocks.txt.
// Strategies: 0 none, 1 every line to L2, 2 every line to L1, 3 the first two lines of each block, 4 every 4th line.
// g++ -O2 -march=sapphirerapids -fopenmp -o random_blocks random_blocks.cpp && ./random_blocks D STRATEGY W
#include <immintrin.h>
#include <x86intrin.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <random>
#include <omp.h>
int main(int argc, char** argv) {
  int D = atoi(argv[1]), strat = atoi(argv[2]), work = atoi(argv[3]);
  const int blockb = 3072; const size_t NB = (size_t)150 * 1024 * 1024 / 2 / blockb;
  char* lat = (char*)aligned_alloc(4096, NB * blockb); char* rope = (char*)aligned_alloc(4096, NB * blockb);
  memset(lat, 1, NB * blockb); memset(rope, 2, NB * blockb);
  std::vector<int64_t> order(NB); for (size_t i = 0; i < NB; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    double t0 = omp_get_wtime(); int64_t total = 0;
#pragma omp parallel num_threads(2) reduction(+:total)
    {
      int tid = omp_get_thread_num();
      __m512 acc = _mm512_setzero_ps(), w = _mm512_set1_ps(1.0001f);
      size_t lo = NB * tid / 2, hi = NB * (tid + 1) / 2;
      for (size_t i = lo; i < hi; ++i) {
        if (strat && i + D < hi) {
          const char* pl = lat + order[i + D] * blockb; const char* pr = rope + order[i + D] * blockb;
          int step = strat == 4 ? 256 : 64, lim = strat == 3 ? 128 : blockb;
          for (int o = 0; o < lim; o += step) {
            if (strat == 2) { _mm_prefetch(pl + o, _MM_HINT_T0); _mm_prefetch(pr + o, _MM_HINT_T0); }
            else { _mm_prefetch(pl + o, _MM_HINT_T1); _mm_prefetch(pr + o, _MM_HINT_T1); }
          }
        }
        const char* l = lat + order[i] * blockb; const char* r = rope + order[i] * blockb;
        __m512i s = _mm512_setzero_si512();
        for (int o = 0; o < blockb; o += 64) s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_load_si512(l + o), _mm512_load_si512(r + o)));
        acc = _mm512_add_ps(acc, _mm512_cvtepi32_ps(s));
        for (int k = 0; k < work; ++k) acc = _mm512_fmadd_ps(acc, w, w);  // dependent chain: ~4 cycles each
      }
      float o[16]; _mm512_storeu_ps(o, acc); total += (int64_t)o[0];
    }
    double dt = omp_get_wtime() - t0; if (dt < best) best = dt;
    if (total == 42) printf("x");
  }
  printf("D %d strat %d work %d: %.1f GB/s, %.0f ns per block pair per thread\n", D, strat, work, 2.0 * NB * blockb / best / 1e9, best / (NB / 2) * 1e9);
}
