// How a unit runs a decode's work items (mla_paths.h DecodeWork).
// Included by each attention_<isa>.cpp inside its ISA namespace, after its kernel headers.

// Every work item of `w` on its team, each thread with its own scratch S (made from w before its first
// item, gone after its last), the items handed out one at a time (their lengths differ). An item's
// bits depend on its own inputs alone: never on the thread or the order.
template <class S, class Item>
static void run_items(const DecodeWork& w, Item item) {
#pragma omp parallel num_threads(w.threads)
  {
    S s(w);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < w.items; ++it) item(s, it);
  }
}

using AttendF32 = void (*)(const Job&, int64_t, int64_t, int64_t, const float*, const int64_t*, float*, float*, float*,
                           float*, float*);

// float32 query rows over any cache: Attend is mla_decode_impl.h attend_span (or mla_decode_avx2.h's).
template <AttendF32 Attend>
static void decode_f32(const DecodeWork& w) {
  struct Scratch {
    std::vector<float> tile, sc;  // TILE rows widened to float32; a tile's scores and weights
    explicit Scratch(const DecodeWork& w) : tile(TILE * w.D + TC_SLACK), sc(TILE + 64 + w.r) {}
  };
  run_items<Scratch>(w, [&w](Scratch& s, int64_t it) {
    const int64_t b = w.item_b[it];
    Attend(*w.job, b, w.item_t0[it], w.item_t1[it], w.qf + b * w.M * w.D, w.lim + b * w.M, w.acc + it * w.M * w.r,
           w.mx + it * w.M, w.sum + it * w.M, s.tile.data(), s.sc.data());
  });
}
