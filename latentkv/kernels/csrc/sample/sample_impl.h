// One row of the batched sampler, for one instruction set. Included by sample_<isa>.cpp inside
// `namespace isa_<name>` under its `#pragma GCC target`, after exp_poly.h; nothing here may include
// a header (we are inside a namespace: sample_common.h has them).
//
// The row's distribution is softmax(l / T) truncated as SamplingParams says: top_k, then top_p over
// the top-k mass, then min_p (a token's e^((l - max) / T) >= min_p). Truncation keeps a prefix of
// the order (logit descending, index ascending): what a stable descending sort gives, and what
// engine/sampler.py's `truncate` (the reference) keeps. The token is then drawn by inverse CDF over
// the kept tokens in index order with the row's one uniform u: the first token whose running mass
// exceeds u x (kept mass), so a row costs one random number, not one per logit.
//
// No sort of the vocabulary: a histogram of each logit's distance below the max (BUCKETS bins over
// RANGE nats of (max - l) / T) finds the bin where the top-k count or the top-p mass is reached, and
// only that bin's tokens are sorted. A row is a few passes over V floats (in L2) plus one small sort.
// Every sum runs in a fixed order, so a row's token depends only on its logits, its settings and u:
// never on the rows beside it or the threads.

constexpr int BUCKETS = 2048;
constexpr float RANGE = 87.0f;   // e^-87 is exp_poly's floor: tokens further below the max weigh 0 here
constexpr int64_t BLOCK = 1024;  // tokens per block of the inverse-CDF walk

// -> the index of the row's first NaN (argmax's answer: NaN counts as the largest), else -1; *max.
static int64_t row_max(const float* __restrict l, int64_t V, float* max) {
  float m = -INFINITY;
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < V; ++i) {
    m = l[i] > m ? l[i] : m;
    nan |= l[i] != l[i];
  }
  *max = m;
  if (nan)
    for (int64_t i = 0; i < V; ++i)
      if (l[i] != l[i]) return i;
  return -1;
}

// e[i] = e^((l[i] - m) * inv_t), 0 further than RANGE below the max (a masked -inf logit: 0).
static void row_exp(const float* __restrict l, int64_t V, float m, float inv_t, float* __restrict e) {
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) {
    const float d = (l[i] - m) * inv_t;
    const float v = exp_poly(d);
    e[i] = d >= -RANGE ? v : 0.0f;
  }
}

// The histogram: each token's bin (monotone in its logit: equal logits share a bin, a larger logit
// never lands in a later one), tokens and mass per bin.
static void row_histogram(const float* __restrict l, const float* __restrict e, int64_t V, float m, float inv_t,
                          RowScratch& s) {
  const float per_nat = BUCKETS / RANGE;
  uint16_t* __restrict b = s.bucket.data();
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) {
    const float d = (m - l[i]) * inv_t * per_nat;  // >= 0; +inf for a -inf logit
    b[i] = d < (float)(BUCKETS - 1) ? (uint16_t)(int32_t)d : (uint16_t)(BUCKETS - 1);
  }
  s.count.assign(BUCKETS, 0);
  s.mass.assign(BUCKETS, 0.0);
  for (int64_t i = 0; i < V; ++i) {
    ++s.count[b[i]];
    s.mass[b[i]] += e[i];
  }
}

// s.cand = the tokens of bin `bin` in the order (logit descending, index ascending).
static void bin_tokens(const float* l, int64_t V, int bin, RowScratch& s) {
  s.cand.clear();
  const uint16_t* b = s.bucket.data();
  for (int64_t i = 0; i < V; ++i)
    if (b[i] == bin) s.cand.push_back(i);
  std::sort(s.cand.begin(), s.cand.end(), [l](int64_t x, int64_t y) { return l[x] > l[y] || (l[x] == l[y] && x < y); });
}

// The last token of the prefix that top_k and top_p keep -> (*cut_l, *cut_i): a token stays where
// l > cut_l, or l == cut_l and its index <= cut_i. (-inf, V): everything stays.
static void cut_prefix(const float* l, int64_t V, float m, float inv_t, const RowParams& p, RowScratch& s,
                       float* cut_l, int64_t* cut_i) {
  const float* e = s.e.data();
  s.bucket.resize(V);
  row_histogram(l, e, V, m, inv_t, s);
  *cut_l = -INFINITY;
  *cut_i = V;
  int sorted = -1;  // the bin whose tokens s.cand holds
  auto tokens = [&](int bin) {
    if (sorted != bin) bin_tokens(l, V, bin, s), sorted = bin;
    return s.cand.data();
  };
  // top_k: the bin holding the k-th token, then its place there. A bin of no mass cuts nothing the
  // draw could pick (its tokens weigh 0), so it is not sorted.
  const int64_t k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  double kept_mass = 0.0;
  if (k < V) {
    int64_t before = 0;
    int bin = 0;
    for (; before + s.count[bin] < k; ++bin) before += s.count[bin], kept_mass += s.mass[bin];
    if (s.mass[bin] > 0.0) {
      const int64_t* t = tokens(bin);
      for (int64_t j = 0; j < k - before; ++j) kept_mass += e[t[j]];
      *cut_l = l[t[k - before - 1]];
      *cut_i = t[k - before - 1];
    }
  } else {
    for (int bin = 0; bin < BUCKETS; ++bin) kept_mass += s.mass[bin];
  }
  if (!(p.top_p < 1.0f)) return;
  // top_p: a token stays while the mass before it (in the order) is below top_p x the top-k mass; the
  // first token that reaches it is the last kept (the top token always stays).
  const double target = (double)p.top_p * kept_mass;
  int64_t before = 0;
  double mass = 0.0;
  int bin = 0;
  for (; bin < BUCKETS && !(s.mass[bin] > 0.0 && mass + s.mass[bin] >= target); ++bin)
    before += s.count[bin], mass += s.mass[bin];
  if (bin == BUCKETS || before >= k) return;  // reached only by rounding, or past top_k's cut
  const int64_t* t = tokens(bin);
  const int64_t room = std::min<int64_t>(s.count[bin], k - before);  // the bin's tokens inside top_k's prefix
  int64_t j = 0;
  for (; j < room; ++j) {
    mass += e[t[j]];
    if (mass >= target) break;
  }
  if (j == room) {
    if (room < s.count[bin] || before + room == k) return;  // top_k's cut comes first
    j = room - 1;  // rounding left the target just out of this bin's reach: its last token
  }
  *cut_l = l[t[j]];
  *cut_i = t[j];
}

int64_t sample_row(const float* l, int64_t V, const RowParams& p, RowScratch& s, float* kept) {
  float m;
  const int64_t nan = row_max(l, V, &m);
  if (nan >= 0) return nan;
  if (m == -INFINITY) return 0;  // every token masked: argmax's answer
  if (m == INFINITY)
    for (int64_t i = 0; i < V; ++i)
      if (l[i] == INFINITY) return i;
  const float inv_t = 1.0f / p.temperature;
  s.e.resize(V);
  float* __restrict e = s.e.data();
  row_exp(l, V, m, inv_t, e);
  float cut_l = -INFINITY;
  int64_t cut_i = V;
  if ((p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f) cut_prefix(l, V, m, inv_t, p, s, &cut_l, &cut_i);
  // The kept tokens' mass per block (the top token always stays: its e is exactly 1 >= min_p).
  const float floor = p.min_p;
  const int64_t blocks = (V + BLOCK - 1) / BLOCK;
  s.block.resize(blocks);
  double total = 0.0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t i1 = std::min(V, (blk + 1) * BLOCK);
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = blk * BLOCK; i < i1; ++i) {
      const bool keep = (l[i] > cut_l || (l[i] == cut_l && i <= cut_i)) && e[i] >= floor;
      const float v = keep ? e[i] : 0.0f;
      e[i] = v;
      acc += v;
    }
    s.block[blk] = acc;
    total += acc;
  }
  if (kept) std::copy(e, e + V, kept);
  // Inverse CDF: the block, then the token, where the running mass passes u x total.
  const double target = p.u * total;
  double run = 0.0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    if (!(run + s.block[blk] > target)) {
      run += s.block[blk];
      continue;
    }
    int64_t last = -1;
    for (int64_t i = blk * BLOCK, i1 = std::min(V, (blk + 1) * BLOCK); i < i1; ++i) {
      if (e[i] > 0.0f) {
        run += e[i];
        last = i;
        if (run > target) return i;
      }
    }
    return last;  // the block's vector sum passed the target, the walk's sum by rounding did not
  }
  for (int64_t i = V - 1; i > 0; --i)  // u x total at the very end (rounding): the last kept token
    if (e[i] > 0.0f) return i;
  return 0;
}

// Log-probabilities of the raw row (log_softmax's values, as vLLM returns them): the chosen token's
// and its rank (1 + the tokens strictly above it), and the n largest (value descending, index
// ascending) into top_vals / top_ids [n]. Blocks of 64 whose max cannot enter the top n are skipped
// after one vector pass, so a row costs ~three passes over V whatever n.
void logprob_row(const float* __restrict l, int64_t V, int64_t chosen, int64_t n, float* top_vals, int64_t* top_ids,
                 float* chosen_logprob, int64_t* rank) {
  float m;
  row_max(l, V, &m);  // a NaN logit makes log_z NaN below, as log_softmax does
  float sum = 0.0f;
  int64_t above = 0;
  const float lc = l[chosen];
#pragma omp simd reduction(+ : sum, above)
  for (int64_t i = 0; i < V; ++i) {
    sum += exp_poly(l[i] - m);
    above += l[i] > lc;
  }
  const float log_z = m + std::log(sum);  // NaN logits make it NaN, as log_softmax does
  *chosen_logprob = lc - log_z;
  *rank = above + 1;
  int64_t filled = 0;
  constexpr int64_t B = 64;
  for (int64_t b0 = 0; n > 0 && b0 < V; b0 += B) {
    const int64_t b1 = std::min(V, b0 + B);
    if (filled == n) {
      float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
      for (int64_t i = b0; i < b1; ++i) bm = l[i] > bm ? l[i] : bm;
      if (!(bm > top_vals[n - 1])) continue;
    }
    for (int64_t i = b0; i < b1; ++i) {
      if (filled == n && !(l[i] > top_vals[n - 1])) continue;
      int64_t at = filled < n ? filled++ : n - 1;  // the slot it takes, then moved up past smaller values
      while (at > 0 && top_vals[at - 1] < l[i]) {
        top_vals[at] = top_vals[at - 1];
        top_ids[at] = top_ids[at - 1];
        --at;
      }
      top_vals[at] = l[i];
      top_ids[at] = i;
    }
  }
  for (int64_t j = 0; j < filled; ++j) top_vals[j] -= log_z;
}

// Penalties of one row, into out (the row's logits copied, the seen tokens changed): a token of the
// prompt (where rep != 1) or the output so far is seen; seen tokens' logits are divided by rep where
// positive, multiplied where not; each output token's count c takes freq x c and pres x (c > 0). The
// same float32 operations, in the same order, as a dense [N, V] pass (engine/sampler.py's reference):
// not contracted, so the bits are torch's. An id outside [0, V) has no logit and is passed over.
// count / seen [V] come zeroed and are left zeroed.
__attribute__((optimize("fp-contract=off"))) void penalize_row(
    const float* __restrict l, int64_t V, const int64_t* ids, int64_t n_ids, int64_t n_prompt, float rep, float pres,
    float freq, float* __restrict out, int32_t* count, uint8_t* seen, std::vector<int64_t>& touched) {
  std::copy(l, l + V, out);
  touched.clear();
  for (int64_t j = rep != 1.0f ? 0 : n_prompt; j < n_ids; ++j) {
    const int64_t t = ids[j];
    if (t < 0 || t >= V) continue;
    if (!seen[t]) seen[t] = 1, touched.push_back(t);
    if (j >= n_prompt) ++count[t];
  }
  for (const int64_t t : touched) {
    float v = l[t];
    if (rep != 1.0f) v = v > 0.0f ? v / rep : v * rep;
    const float c = (float)count[t];
    const float f = freq * c;
    v = v - f;
    const float p = pres * (c > 0.0f ? 1.0f : 0.0f);
    v = v - p;
    out[t] = v;
    count[t] = 0;
    seen[t] = 0;
  }
}
