// Paged-attention decode for x86-64 CPUs with AVX2 + FMA, on vLLM's CPU KV-cache layout.
//
// One query token per sequence attends to its whole context, which lives in fixed-size blocks
// found through a block table. The cache tensor is declared
// [num_blocks, num_kv_heads, block_size, 2 * head_size], but vLLM's CPU backend (the "vec" and
// "vec16" ISAs, the ones AVX2 hosts use) fills each (block, kv_head) slab of
// 2 * block_size * head_size elements as
//     K transposed: [head_size][block_size]   (row d holds dimension d of every token)
//     V:            [block_size][head_size]
// which is what cpu_attn_reshape_and_cache writes. Transposed K suits decode: a vector load
// of row d covers 8 or 16 tokens, so q.K for a tile of tokens is a run of broadcast FMAs.
//
// Work is split into items (sequence, kv head, partition of the context). All query heads that
// share a kv head are computed in the same item, so each K/V byte leaves memory once per step.
// Long contexts with few sequences are cut into partitions (flash-decoding); each partition
// keeps its running max and sum, and a second phase merges them by log-sum-exp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace llmconsole_cpu {
namespace {

// Tokens per logits chunk: one softmax rescale of the accumulators per chunk, so small blocks
// are grouped until a chunk holds at least this many tokens.
constexpr int kChunkTokens = 128;
// Below this many tokens per partition the merge costs more than the extra parallelism saves.
constexpr int kMinPartitionTokens = 256;
// Items per thread the automatic split aims for, so dynamic scheduling can even out ragged work.
constexpr int kItemsPerThread = 4;
// Query heads computed together in one register tile (8 accumulators of 8 floats each for
// 16 tokens); larger GQA groups take several tiles over the same, cache-hot, K/V lines.
#ifndef LLMC_HEADS_PER_TILE
#define LLMC_HEADS_PER_TILE 4
#endif
constexpr int kHeadsPerTile = LLMC_HEADS_PER_TILE;

// ---- loads: 16 elements -> two fp32 vectors ------------------------------------------------
//
// bf16 is the top half of an fp32, so a 32-bit lane holding elements (2i, 2i+1) yields
// element 2i by a left shift of 16 and element 2i+1 by masking the low half: one integer op
// per 8 values and no cross-lane shuffles. The price is an even/odd order (lo = elements
// 0,2,..,14; hi = 1,3,..,15), which the kernel undoes once per tile of logits and once per
// output row, where it is cheap.

template <typename T>
struct Load16;

template <>
struct Load16<float> {
  static constexpr bool kEvenOdd = false;
  static inline void load(const float* p, __m256& lo, __m256& hi) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
};

template <>
struct Load16<at::BFloat16> {
  static constexpr bool kEvenOdd = true;
  static inline void load(const at::BFloat16* p, __m256& lo, __m256& hi) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(int(0xFFFF0000u))));
  }
};

// Turns an (even, odd) pair back into elements 0..7 and 8..15.
static inline void even_odd_to_natural(__m256 even, __m256 odd, __m256& first, __m256& second) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd);  // 0 1 2 3 | 8 9 10 11
  const __m256 hi = _mm256_unpackhi_ps(even, odd);  // 4 5 6 7 | 12 13 14 15
  first = _mm256_permute2f128_ps(lo, hi, 0x20);
  second = _mm256_permute2f128_ps(lo, hi, 0x31);
}

// exp for fp32 lanes (Cephes polynomial, ~1 ulp); inputs below -88 give 0, as masking needs.
static inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_cvttps_epi32(fx);
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

static inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Streams the next chunk's slabs into cache while the current chunk computes. The kernel's
// reads within a slab are strided (a tile of tokens touches one line per K row), which the
// hardware prefetchers follow poorly; without this, memory and compute take turns instead of
// overlapping (about 10 GB/s instead of 17 on a 2-core EPYC). The inner loops call step()
// once per iteration; requests are paced so the whole next chunk is asked for over the first
// LLMC_PREFETCH_PACE_PERCENT of this chunk's iterations, not in a burst that would fill the
// miss queues and stall the compute. Spread over the whole chunk (100%) the request rate stays
// near what memory delivers: on a 2-vCPU EPYC (one core, two SMT threads, so compute and
// memory share one core's miss queues) that took batch 32 x 4K from 59% to 78% of a plain
// read, against 50%.
#ifndef LLMC_PREFETCH
#define LLMC_PREFETCH 1
#endif
#ifndef LLMC_PREFETCH_CHUNKS_AHEAD
#define LLMC_PREFETCH_CHUNKS_AHEAD 1
#endif
#ifndef LLMC_PREFETCH_PACE_PERCENT
#define LLMC_PREFETCH_PACE_PERCENT 100
#endif
#ifndef LLMC_PREFETCH_NEXT_ITEM
#define LLMC_PREFETCH_NEXT_ITEM 1
#endif
#ifndef LLMC_PREFETCH_HINT
#define LLMC_PREFETCH_HINT _MM_HINT_T1
#endif

// The per-iteration part of a Prefetcher, copied into the tile's locals so the compiler keeps
// it in registers: a countdown kept in memory would put a store-to-load round trip on every
// iteration of the FMA loops.
struct PrefetchCursor {
  const char* cur;
  const char* end;
  int every, lines_per_step, countdown;

  inline void step() {
    if (!LLMC_PREFETCH || --countdown > 0) return;
    countdown = every;
    for (int i = 0; i < lines_per_step; ++i) {
      if (cur >= end) return;
      _mm_prefetch(cur, LLMC_PREFETCH_HINT);
      cur += 64;
    }
  }
};

struct Prefetcher {
  static constexpr int kMaxSlabs = kChunkTokens / 16 + 1;
  const char* slabs[kMaxSlabs];
  int num_slabs = 0, index = 0;
  int64_t slab_bytes = 0;
  const char* cur = nullptr;
  const char* end = nullptr;
  int every = 1, lines_per_step = 1, countdown = 1;

  void reset(int64_t bytes) {
    num_slabs = index = 0;
    slab_bytes = bytes;
    cur = end = nullptr;
  }
  void add(const void* slab) {
    if (num_slabs == 0) {
      cur = static_cast<const char*>(slab);
      end = cur + slab_bytes;
    }
    slabs[num_slabs++] = static_cast<const char*>(slab);
  }
  // Spreads the queued lines over `iterations` inner-loop steps.
  void pace(int64_t iterations) {
    const int64_t lines = num_slabs * slab_bytes / 64;
    const int64_t window = std::max<int64_t>(1, iterations * LLMC_PREFETCH_PACE_PERCENT / 100);
    if (lines >= window) {
      every = 1;
      lines_per_step = int((lines + window - 1) / window);
    } else {
      every = int(window / std::max<int64_t>(lines, 1));
      lines_per_step = 1;
    }
    countdown = every;
  }
  PrefetchCursor cursor() const { return {cur, end, every, lines_per_step, countdown}; }
  // Takes back a tile's progress; a slab finished mid-tile hands over to the next one here.
  void commit(const PrefetchCursor& c) {
    cur = c.cur;
    countdown = c.countdown;
    if (cur >= end && index + 1 < num_slabs) {
      cur = slabs[++index];
      end = cur + slab_bytes;
    }
  }
};

// ---- q.K for a tile: GT query heads x (16 * NL) tokens of one block ------------------------

// The register tiles are small arrays indexed by loop counters. Unless those loops are fully
// unrolled early, GCC keeps the arrays in memory and stores every accumulator on every
// iteration, which halves the FMA rate.
#define LLMC_UNROLL _Pragma("GCC unroll 16")

template <typename T, int GT, int NL>
static inline void qk_tile(const T* __restrict k_t, int block_size, int head_size,
                           const float* __restrict q, float* __restrict logits,
                           int logits_stride, Prefetcher& pf) {
  __m256 acc_lo[GT][NL];
  __m256 acc_hi[GT][NL];
  LLMC_UNROLL
  for (int g = 0; g < GT; ++g)
    LLMC_UNROLL
    for (int l = 0; l < NL; ++l) acc_lo[g][l] = acc_hi[g][l] = _mm256_setzero_ps();

  PrefetchCursor pc = pf.cursor();
  const T* row = k_t;
  for (int d = 0; d < head_size; ++d, row += block_size) {
    pc.step();
    __m256 k_lo[NL], k_hi[NL];
    LLMC_UNROLL
    for (int l = 0; l < NL; ++l) Load16<T>::load(row + 16 * l, k_lo[l], k_hi[l]);
    LLMC_UNROLL
    for (int g = 0; g < GT; ++g) {
      const __m256 qd = _mm256_broadcast_ss(q + g * head_size + d);
      LLMC_UNROLL
      for (int l = 0; l < NL; ++l) {
        acc_lo[g][l] = _mm256_fmadd_ps(qd, k_lo[l], acc_lo[g][l]);
        acc_hi[g][l] = _mm256_fmadd_ps(qd, k_hi[l], acc_hi[g][l]);
      }
    }
  }
  pf.commit(pc);
  LLMC_UNROLL
  for (int g = 0; g < GT; ++g) {
    float* dst = logits + g * logits_stride;
    LLMC_UNROLL
    for (int l = 0; l < NL; ++l) {
      __m256 first = acc_lo[g][l], second = acc_hi[g][l];
      if (Load16<T>::kEvenOdd) even_odd_to_natural(acc_lo[g][l], acc_hi[g][l], first, second);
      _mm256_storeu_ps(dst + 16 * l, first);
      _mm256_storeu_ps(dst + 16 * l + 8, second);
    }
  }
}

template <typename T, int GT>
__attribute__((noinline)) static void qk_heads(const T* k_t, int block_size, int head_size, int num_tokens,
                     const float* q, float* logits, int logits_stride, Prefetcher& pf) {
  // Wider token tiles when few heads share the tile, to keep 8 FMA chains in flight.
  constexpr int kWideLoads = GT >= 4 ? 1 : (GT == 1 ? 4 : 2);
  int t = 0;
  for (; t + 16 * kWideLoads <= num_tokens; t += 16 * kWideLoads)
    qk_tile<T, GT, kWideLoads>(k_t + t, block_size, head_size, q, logits + t, logits_stride,
                               pf);
  // The tail tile may run past the context into the rest of the block (never past it, the
  // block size being a multiple of 16); those logits are computed but never read.
  for (; t < num_tokens; t += 16)
    qk_tile<T, GT, 1>(k_t + t, block_size, head_size, q, logits + t, logits_stride, pf);
}

template <typename T>
static void qk_block(const T* k_t, int block_size, int head_size, int num_tokens,
                     int num_heads, const float* q, float* logits, int logits_stride,
                     Prefetcher& pf) {
  int g = 0;
  for (; g + kHeadsPerTile <= num_heads; g += kHeadsPerTile)
    qk_heads<T, kHeadsPerTile>(k_t, block_size, head_size, num_tokens, q + g * head_size,
                               logits + g * logits_stride, logits_stride, pf);
  switch (num_heads - g) {
    case 3:
      qk_heads<T, 3>(k_t, block_size, head_size, num_tokens, q + g * head_size,
                     logits + g * logits_stride, logits_stride, pf);
      break;
    case 2:
      qk_heads<T, 2>(k_t, block_size, head_size, num_tokens, q + g * head_size,
                     logits + g * logits_stride, logits_stride, pf);
      break;
    case 1:
      qk_heads<T, 1>(k_t, block_size, head_size, num_tokens, q + g * head_size,
                     logits + g * logits_stride, logits_stride, pf);
      break;
    default:
      break;
  }
}

// ---- p.V for a tile: GT query heads x (16 * DL) output dims over a chunk of tokens ---------
//
// Accumulators stay in the loader's order (even/odd for bf16) between chunks; the order is
// undone when the row is written out.

template <typename T, int GT, int DL>
static inline void pv_tile(const T* const* v_blocks, int num_blocks, int block_size,
                           int head_size, int num_tokens, const float* __restrict probs,
                           int probs_stride, float* __restrict acc, Prefetcher& pf) {
  __m256 a_lo[GT][DL], a_hi[GT][DL];
  LLMC_UNROLL
  for (int g = 0; g < GT; ++g)
    LLMC_UNROLL
    for (int l = 0; l < DL; ++l) {
      a_lo[g][l] = _mm256_loadu_ps(acc + g * head_size + 16 * l);
      a_hi[g][l] = _mm256_loadu_ps(acc + g * head_size + 16 * l + 8);
    }
  PrefetchCursor pc = pf.cursor();
  int base = 0;
  for (int b = 0; b < num_blocks; ++b, base += block_size) {
    const int n = std::min(block_size, num_tokens - base);
    const T* row = v_blocks[b];
    const float* p = probs + base;
    for (int t = 0; t < n; ++t, row += head_size) {
      pc.step();
      __m256 v_lo[DL], v_hi[DL];
      LLMC_UNROLL
      for (int l = 0; l < DL; ++l) Load16<T>::load(row + 16 * l, v_lo[l], v_hi[l]);
      LLMC_UNROLL
      for (int g = 0; g < GT; ++g) {
        const __m256 pt = _mm256_broadcast_ss(p + g * probs_stride + t);
        LLMC_UNROLL
        for (int l = 0; l < DL; ++l) {
          a_lo[g][l] = _mm256_fmadd_ps(pt, v_lo[l], a_lo[g][l]);
          a_hi[g][l] = _mm256_fmadd_ps(pt, v_hi[l], a_hi[g][l]);
        }
      }
    }
  }
  pf.commit(pc);
  LLMC_UNROLL
  for (int g = 0; g < GT; ++g)
    LLMC_UNROLL
    for (int l = 0; l < DL; ++l) {
      _mm256_storeu_ps(acc + g * head_size + 16 * l, a_lo[g][l]);
      _mm256_storeu_ps(acc + g * head_size + 16 * l + 8, a_hi[g][l]);
    }
}

template <typename T, int GT>
__attribute__((noinline)) static void pv_heads(const T* const* v_blocks, int num_blocks, int block_size, int head_size,
                     int num_tokens, const float* probs, int probs_stride, float* acc,
                     Prefetcher& pf) {
  constexpr int kWideLoads = GT >= 4 ? 1 : (GT == 1 ? 4 : 2);
  int d = 0;
  for (; d + 16 * kWideLoads <= head_size; d += 16 * kWideLoads) {
    const T* shifted[kChunkTokens / 16 + 1];
    for (int b = 0; b < num_blocks; ++b) shifted[b] = v_blocks[b] + d;
    pv_tile<T, GT, kWideLoads>(shifted, num_blocks, block_size, head_size, num_tokens, probs,
                               probs_stride, acc + d, pf);
  }
  for (; d < head_size; d += 16) {
    const T* shifted[kChunkTokens / 16 + 1];
    for (int b = 0; b < num_blocks; ++b) shifted[b] = v_blocks[b] + d;
    pv_tile<T, GT, 1>(shifted, num_blocks, block_size, head_size, num_tokens, probs,
                      probs_stride, acc + d, pf);
  }
}

template <typename T>
static void pv_chunk(const T* const* v_blocks, int num_blocks, int block_size, int head_size,
                     int num_tokens, int num_heads, const float* probs, int probs_stride,
                     float* acc, Prefetcher& pf) {
  int g = 0;
  for (; g + kHeadsPerTile <= num_heads; g += kHeadsPerTile)
    pv_heads<T, kHeadsPerTile>(v_blocks, num_blocks, block_size, head_size, num_tokens,
                               probs + g * probs_stride, probs_stride, acc + g * head_size, pf);
  switch (num_heads - g) {
    case 3:
      pv_heads<T, 3>(v_blocks, num_blocks, block_size, head_size, num_tokens,
                     probs + g * probs_stride, probs_stride, acc + g * head_size, pf);
      break;
    case 2:
      pv_heads<T, 2>(v_blocks, num_blocks, block_size, head_size, num_tokens,
                     probs + g * probs_stride, probs_stride, acc + g * head_size, pf);
      break;
    case 1:
      pv_heads<T, 1>(v_blocks, num_blocks, block_size, head_size, num_tokens,
                     probs + g * probs_stride, probs_stride, acc + g * head_size, pf);
      break;
    default:
      break;
  }
}

// ---- one work item ---------------------------------------------------------------------------

struct Problem {
  int num_seqs, num_heads, num_kv_heads, group, head_size, block_size, max_blocks;
  int64_t q_stride_seq, q_stride_head, out_stride_seq, out_stride_head, bt_stride;
  int64_t kv_stride_block, kv_stride_head;
  float scale;
  const int32_t* block_tables;
  const int32_t* context_lens;
};

struct Item {
  int seq, kv_head, token_begin, token_end;
  int slot;  // row in the partial-result buffers; -1 when the item is a whole context
};

struct Scratch {
  std::vector<float> q, logits, acc, max_logit, exp_sum;
  int logits_stride = 0;
  Scratch(const Problem& p, int chunk_tokens)
      : q(size_t(p.group) * p.head_size),
        logits(size_t(p.group) * chunk_tokens),
        acc(size_t(p.group) * p.head_size),
        max_logit(p.group),
        exp_sum(p.group),
        logits_stride(chunk_tokens) {}
};

template <typename T>
static inline float to_float(T v) {
  return static_cast<float>(v);
}

// Undoes the loader's element order of one accumulator row (in place).
template <typename T>
static inline void acc_row_to_natural(float* row, int head_size) {
  if (!Load16<T>::kEvenOdd) return;
  for (int d = 0; d < head_size; d += 16) {
    __m256 first, second;
    even_odd_to_natural(_mm256_loadu_ps(row + d), _mm256_loadu_ps(row + d + 8), first, second);
    _mm256_storeu_ps(row + d, first);
    _mm256_storeu_ps(row + d + 8, second);
  }
}

// Inner-loop iterations (calls to Prefetcher::step) one chunk of n tokens costs; mirrors the
// tiling in qk_heads / pv_heads.
static int64_t inner_iterations(int group, int head_size, int block_size, int n) {
  auto wide = [](int gt) { return gt >= 4 ? 1 : (gt == 1 ? 4 : 2); };
  int64_t total = 0;
  for (int g = 0; g < group; g += kHeadsPerTile) {
    const int gt = std::min(kHeadsPerTile, group - g);
    const int tokens_per_tile = 16 * wide(gt);
    for (int b = 0; b * block_size < n; ++b) {
      const int nb = std::min(block_size, n - b * block_size);
      total += int64_t((nb + tokens_per_tile - 1) / tokens_per_tile) * head_size;
    }
    total += int64_t((head_size + 16 * wide(gt) - 1) / (16 * wide(gt))) * n;
  }
  return total;
}

template <typename T>
static void run_item(const Problem& p, const T* query, const T* kv_cache, T* out,
                     const Item& item, const Item* next_item, Scratch& s, float* part_acc, float* part_max,
                     float* part_sum) {
  const int G = p.group, H = p.head_size, bs = p.block_size;
  const int first_head = item.kv_head * G;
  const T* q_src = query + item.seq * p.q_stride_seq + first_head * p.q_stride_head;
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < H; ++d)
      s.q[g * H + d] = to_float(q_src[g * p.q_stride_head + d]) * p.scale;
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  std::fill(s.max_logit.begin(), s.max_logit.end(), -std::numeric_limits<float>::infinity());
  std::fill(s.exp_sum.begin(), s.exp_sum.end(), 0.0f);

  const int32_t* table = p.block_tables + item.seq * p.bt_stride;
  const int blocks_per_chunk = std::max(1, kChunkTokens / bs);
  const T* v_blocks[kChunkTokens / 16 + 1];
  const int ls = s.logits_stride;
  float* logits = s.logits.data();

  const int64_t slab_bytes = int64_t(bs) * H * 2 * sizeof(T);
  const int last_block = (item.token_end + bs - 1) / bs;  // one past the item's last block
  Prefetcher pf;

  for (int tok = item.token_begin; tok < item.token_end;) {
    const int first_block = tok / bs;
    const int n = std::min(item.token_end - tok, blocks_per_chunk * bs);
    const int nblocks = (n + bs - 1) / bs;

    pf.reset(slab_bytes);
    const int ahead = first_block + LLMC_PREFETCH_CHUNKS_AHEAD * blocks_per_chunk;
    if (ahead < last_block) {
      for (int b = ahead; b < std::min(last_block, ahead + blocks_per_chunk); ++b)
        pf.add(kv_cache + int64_t(table[b]) * p.kv_stride_block +
               int64_t(item.kv_head) * p.kv_stride_head);
    } else if (LLMC_PREFETCH_NEXT_ITEM && next_item != nullptr &&
               next_item->token_end > next_item->token_begin) {
      // The last chunk warms the start of the item this thread will probably take next; a
      // wrong guess still leaves the lines in a cache the other core can be served from.
      const int32_t* next_table = p.block_tables + next_item->seq * p.bt_stride;
      const int b0 = next_item->token_begin / bs;
      const int b1 = std::min((next_item->token_end + bs - 1) / bs, b0 + blocks_per_chunk);
      for (int b = b0; b < b1; ++b)
        pf.add(kv_cache + int64_t(next_table[b]) * p.kv_stride_block +
               int64_t(next_item->kv_head) * p.kv_stride_head);
    }
    pf.pace(inner_iterations(G, H, bs, n));

    for (int b = 0; b < nblocks; ++b) {
      const T* slab = kv_cache + int64_t(table[first_block + b]) * p.kv_stride_block +
                      int64_t(item.kv_head) * p.kv_stride_head;
      v_blocks[b] = slab + int64_t(bs) * H;
      const int nb = std::min(bs, n - b * bs);
      qk_block<T>(slab, bs, H, nb, G, s.q.data(), logits + b * bs, ls, pf);
    }

    for (int g = 0; g < G; ++g) {
      float* l = logits + g * ls;
      __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      int t = 0;
      for (; t + 8 <= n; t += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(l + t));
      float chunk_max = hmax(vmax);
      for (; t < n; ++t) chunk_max = std::max(chunk_max, l[t]);
      const float new_max = std::max(s.max_logit[g], chunk_max);
      const float rescale = std::exp(s.max_logit[g] - new_max);
      const __m256 vnew = _mm256_set1_ps(new_max);
      __m256 vsum = _mm256_setzero_ps();
      t = 0;
      for (; t + 8 <= n; t += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(l + t), vnew));
        _mm256_storeu_ps(l + t, e);
        vsum = _mm256_add_ps(vsum, e);
      }
      float chunk_sum = hsum(vsum);
      for (; t < n; ++t) {
        l[t] = std::exp(l[t] - new_max);
        chunk_sum += l[t];
      }
      if (rescale != 1.0f) {
        float* a = s.acc.data() + g * H;
        const __m256 vr = _mm256_set1_ps(rescale);
        for (int d = 0; d < H; d += 8) _mm256_storeu_ps(a + d, _mm256_mul_ps(vr, _mm256_loadu_ps(a + d)));
      }
      s.exp_sum[g] = s.exp_sum[g] * rescale + chunk_sum;
      s.max_logit[g] = new_max;
    }

    pv_chunk<T>(v_blocks, nblocks, bs, H, n, G, logits, ls, s.acc.data(), pf);
    tok += n;
  }

  for (int g = 0; g < G; ++g) acc_row_to_natural<T>(s.acc.data() + g * H, H);

  if (item.slot < 0) {
    T* dst = out + item.seq * p.out_stride_seq + first_head * p.out_stride_head;
    for (int g = 0; g < G; ++g) {
      // A zero-length context has nothing to attend to; it yields zeros, not 0/0.
      const float inv = s.exp_sum[g] > 0.0f ? 1.0f / s.exp_sum[g] : 0.0f;
      const float* a = s.acc.data() + g * H;
      for (int d = 0; d < H; ++d) dst[g * p.out_stride_head + d] = static_cast<T>(a[d] * inv);
    }
  } else {
    std::memcpy(part_acc + int64_t(item.slot) * G * H, s.acc.data(), sizeof(float) * G * H);
    std::memcpy(part_max + int64_t(item.slot) * G, s.max_logit.data(), sizeof(float) * G);
    std::memcpy(part_sum + int64_t(item.slot) * G, s.exp_sum.data(), sizeof(float) * G);
  }
}

// Combines the partitions of one (sequence, kv head) by log-sum-exp.
template <typename T>
static void merge_partitions(const Problem& p, int seq, int kv_head, int first_slot,
                             int num_parts, const float* part_acc, const float* part_max,
                             const float* part_sum, T* out, float* row) {
  const int G = p.group, H = p.head_size;
  T* dst = out + seq * p.out_stride_seq + int64_t(kv_head) * G * p.out_stride_head;
  for (int g = 0; g < G; ++g) {
    float global_max = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < num_parts; ++i)
      global_max = std::max(global_max, part_max[int64_t(first_slot + i) * G + g]);
    std::fill(row, row + H, 0.0f);
    float total = 0.0f;
    for (int i = 0; i < num_parts; ++i) {
      const int64_t slot = first_slot + i;
      const float w = std::exp(part_max[slot * G + g] - global_max);
      total += w * part_sum[slot * G + g];
      const float* a = part_acc + (slot * G + g) * H;
      for (int d = 0; d < H; ++d) row[d] += w * a[d];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = 0; d < H; ++d) dst[g * p.out_stride_head + d] = static_cast<T>(row[d] * inv);
  }
}

// Tokens per partition: the whole longest context unless there are too few (sequence, kv head)
// pairs to give every thread several items, in which case contexts are cut into block-aligned
// partitions of at least kMinPartitionTokens.
static int64_t choose_partition_tokens(const int32_t* context_lens, int num_seqs,
                                       int num_kv_heads, int block_size, int64_t requested,
                                       int num_threads) {
  int64_t max_len = 0, total = 0;
  for (int i = 0; i < num_seqs; ++i) {
    max_len = std::max<int64_t>(max_len, context_lens[i]);
    total += context_lens[i];
  }
  auto round_up = [&](int64_t v) { return (v + block_size - 1) / block_size * block_size; };
  if (requested > 0) return round_up(requested);
  const int64_t max_rounded = std::max<int64_t>(round_up(max_len), block_size);
  const int64_t target = total * num_kv_heads / (int64_t(num_threads) * kItemsPerThread);
  const int64_t tokens = std::max(round_up(target), round_up(kMinPartitionTokens));
  return std::min(tokens, max_rounded);
}

template <typename T>
static void decode(const Problem& p, const T* query, const T* kv_cache, T* out,
                   int64_t partition_tokens) {
  const int num_threads = omp_get_max_threads();
  std::vector<Item> items;
  std::vector<int> merge_first_slot, merge_num_parts, merge_seq, merge_head;
  int slots = 0;
  for (int seq = 0; seq < p.num_seqs; ++seq) {
    const int len = p.context_lens[seq];
    const int parts = len == 0 ? 1 : int((len + partition_tokens - 1) / partition_tokens);
    for (int h = 0; h < p.num_kv_heads; ++h) {
      if (parts == 1) {
        items.push_back({seq, h, 0, len, -1});
        continue;
      }
      merge_first_slot.push_back(slots);
      merge_num_parts.push_back(parts);
      merge_seq.push_back(seq);
      merge_head.push_back(h);
      for (int i = 0; i < parts; ++i) {
        const int begin = int(i * partition_tokens);
        const int end = int(std::min<int64_t>(len, begin + partition_tokens));
        items.push_back({seq, h, begin, end, slots++});
      }
    }
  }
  // Longest first, so the dynamic schedule ends with small items and threads finish together.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return (a.token_end - a.token_begin) > (b.token_end - b.token_begin);
  });

  const int G = p.group, H = p.head_size;
  std::vector<float> part_acc(size_t(slots) * G * H), part_max(size_t(slots) * G),
      part_sum(size_t(slots) * G);
  const int chunk_tokens = std::max(p.block_size, (kChunkTokens / p.block_size) * p.block_size);
  const int num_items = int(items.size());
  const int num_merges = int(merge_seq.size());

  const int team = std::max(1, std::min(num_threads, num_items));
#pragma omp parallel num_threads(team)
  {
    Scratch s(p, chunk_tokens);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < num_items; ++i)
      run_item<T>(p, query, kv_cache, out, items[i],
                  i + team < num_items ? &items[i + team] : nullptr, s, part_acc.data(), part_max.data(),
                  part_sum.data());
    if (num_merges > 0) {
#pragma omp for schedule(dynamic, 1)
      for (int m = 0; m < num_merges; ++m)
        merge_partitions<T>(p, merge_seq[m], merge_head[m], merge_first_slot[m],
                            merge_num_parts[m], part_acc.data(), part_max.data(),
                            part_sum.data(), out, s.acc.data());
    }
  }
}

// ---- op entry points ---------------------------------------------------------------------------

static void check_inputs(const at::Tensor& out, const at::Tensor& query,
                         const at::Tensor& kv_cache, const at::Tensor& block_tables,
                         const at::Tensor& context_lens) {
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu() && out.device().is_cpu() &&
                  block_tables.device().is_cpu() && context_lens.device().is_cpu(),
              "paged_attention_decode: all tensors must be on the CPU");
  TORCH_CHECK(query.dim() == 3, "query must be [num_seqs, num_heads, head_size], got ",
              query.sizes());
  TORCH_CHECK(kv_cache.dim() == 4,
              "kv_cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size], got ",
              kv_cache.sizes());
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "query dtype must be float32 or bfloat16, got ", query.scalar_type());
  TORCH_CHECK(kv_cache.scalar_type() == query.scalar_type(), "kv_cache dtype (",
              kv_cache.scalar_type(), ") must match query dtype (", query.scalar_type(), ")");
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "out dtype (", out.scalar_type(),
              ") must match query dtype (", query.scalar_type(), ")");
  TORCH_CHECK(out.sizes() == query.sizes(), "out shape ", out.sizes(),
              " must match query shape ", query.sizes());
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1,
              "query and out must be contiguous in the head dimension");
  TORCH_CHECK(kv_cache.is_contiguous(), "kv_cache must be contiguous");
  const int64_t head_size = query.size(2);
  TORCH_CHECK(head_size % 16 == 0 && head_size >= 16 && head_size <= 512,
              "head_size must be a multiple of 16 in [16, 512], got ", head_size);
  TORCH_CHECK(kv_cache.size(3) == 2 * head_size, "kv_cache last dim must be 2 * head_size = ",
              2 * head_size, ", got ", kv_cache.size(3));
  const int64_t block_size = kv_cache.size(2);
  TORCH_CHECK(block_size % 16 == 0 && block_size > 0,
              "block_size must be a positive multiple of 16, got ", block_size);
  const int64_t num_kv_heads = kv_cache.size(1);
  TORCH_CHECK(num_kv_heads > 0 && query.size(1) % num_kv_heads == 0, "num_heads (",
              query.size(1), ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 &&
                  block_tables.size(0) == query.size(0) && block_tables.stride(1) == 1,
              "block_tables must be int32 [num_seqs, max_blocks_per_seq] with contiguous rows");
  TORCH_CHECK(context_lens.scalar_type() == at::kInt && context_lens.dim() == 1 &&
                  context_lens.size(0) == query.size(0) && context_lens.is_contiguous(),
              "context_lens must be a contiguous int32 [num_seqs]");
}

static Problem make_problem(const at::Tensor& out, const at::Tensor& query,
                            const at::Tensor& kv_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale) {
  Problem p{};
  p.num_seqs = int(query.size(0));
  p.num_heads = int(query.size(1));
  p.head_size = int(query.size(2));
  p.num_kv_heads = int(kv_cache.size(1));
  p.group = p.num_heads / p.num_kv_heads;
  p.block_size = int(kv_cache.size(2));
  p.max_blocks = int(block_tables.size(1));
  p.q_stride_seq = query.stride(0);
  p.q_stride_head = query.stride(1);
  p.out_stride_seq = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.bt_stride = block_tables.stride(0);
  p.kv_stride_block = kv_cache.stride(0);
  p.kv_stride_head = kv_cache.stride(1);
  p.scale = float(scale);
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.context_lens = context_lens.data_ptr<int32_t>();
  const int64_t num_blocks = kv_cache.size(0);
  // Bad lengths or block ids would read outside the cache, so they are refused up front.
  for (int s = 0; s < p.num_seqs; ++s) {
    const int len = p.context_lens[s];
    TORCH_CHECK(len >= 0 && int64_t(len) <= int64_t(p.max_blocks) * p.block_size,
                "context_lens[", s, "] = ", len, " does not fit in ", p.max_blocks,
                " blocks of ", p.block_size, " tokens");
    const int used = (len + p.block_size - 1) / p.block_size;
    const int32_t* row = p.block_tables + s * p.bt_stride;
    for (int b = 0; b < used; ++b)
      TORCH_CHECK(row[b] >= 0 && row[b] < num_blocks, "block_tables[", s, "][", b, "] = ",
                  row[b], " is outside the cache's ", num_blocks, " blocks");
  }
  return p;
}

void paged_attention_decode(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& context_lens,
                            double scale, int64_t partition_size) {
  check_inputs(out, query, kv_cache, block_tables, context_lens);
  if (query.size(0) == 0) return;
  const Problem p = make_problem(out, query, kv_cache, block_tables, context_lens, scale);
  const int64_t partition_tokens =
      choose_partition_tokens(p.context_lens, p.num_seqs, p.num_kv_heads, p.block_size,
                              partition_size, omp_get_max_threads());
  if (query.scalar_type() == at::kFloat) {
    decode<float>(p, query.data_ptr<float>(), kv_cache.data_ptr<float>(), out.data_ptr<float>(),
                  partition_tokens);
  } else {
    decode<at::BFloat16>(p, query.data_ptr<at::BFloat16>(), kv_cache.data_ptr<at::BFloat16>(),
                         out.data_ptr<at::BFloat16>(), partition_tokens);
  }
}

int64_t paged_attention_decode_partition_tokens(const at::Tensor& context_lens,
                                                int64_t num_kv_heads, int64_t block_size,
                                                int64_t partition_size) {
  TORCH_CHECK(context_lens.scalar_type() == at::kInt && context_lens.dim() == 1 &&
                  context_lens.is_contiguous(),
              "context_lens must be a contiguous int32 [num_seqs]");
  TORCH_CHECK(block_size > 0 && num_kv_heads > 0, "block_size and num_kv_heads must be positive");
  return choose_partition_tokens(context_lens.data_ptr<int32_t>(), int(context_lens.size(0)),
                                 int(num_kv_heads), int(block_size), partition_size,
                                 omp_get_max_threads());
}

}  // namespace
}  // namespace llmconsole_cpu

TORCH_LIBRARY(llmconsole, m) {
  m.def(
      "paged_attention_decode(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_tables, "
      "Tensor context_lens, float scale, int partition_size=0) -> ()");
  m.def(
      "paged_attention_decode_partition_tokens(Tensor context_lens, int num_kv_heads, "
      "int block_size, int partition_size=0) -> int");
}

TORCH_LIBRARY_IMPL(llmconsole, CPU, m) {
  m.impl("paged_attention_decode", &llmconsole_cpu::paged_attention_decode);
  m.impl("paged_attention_decode_partition_tokens",
         &llmconsole_cpu::paged_attention_decode_partition_tokens);
}
