// Paged-attention decode for NVIDIA GPUs (sm_80 and later) on vLLM's CUDA KV-cache layout.
//
// KV layout: the one vLLM's CUDA attention backends (FlashAttention, Triton) receive. A layer's
// cache is logically [num_blocks, num_kv_heads, block_size, 2 * head_size], K then V along the
// last axis; the backends view it as key_cache, value_cache = kv_cache.transpose(1, 2)
// .split(head_size, -1), each [num_blocks, block_size, num_kv_heads, head_size] with any strides
// for the first three axes and a contiguous last one. vLLM picks the physical order at run time
// (LBNHC "NHD" by default, LBHNC "HND", block-outer orders that interleave layers), so the kernel
// takes the three strides of each cache instead of assuming one: every order vLLM can resolve is
// read the same way. block_tables int32 [num_seqs, >= blocks used], seq_lens int32 [num_seqs]
// (the backends' seq_lens: context including the token being decoded). Block size: any multiple
// of 16 (vLLM's CUDA default is 16). Head size 64, 128 or 256. Query/out bf16 or fp16; KV the same
// type, or fp8 e4m3 with per-tensor scales (k_scale, v_scale as vLLM keeps them on the layer).
//
// Why it is built this way (decode reads every KV byte once and does ~1 FMA per byte per query
// head, so the kernel's job is to keep HBM busy, not the ALUs):
//
// * One CTA per (sequence, KV head, split of the context), holding every query head of the GQA
//   group (up to 16; larger groups take ceil(group / 16) CTAs): each K/V byte is loaded once per
//   KV head and used by all the group's query heads from shared memory.
// * Warps stream independently. The CTA's share of the context is cut into 16-token tiles dealt
//   round-robin to its warps; each warp owns a ring of kStages shared-memory stages and keeps
//   kStages - 1 tiles of K and V in flight with cp.async (16-byte copies, L2 128-byte prefetch),
//   waiting only on its own copies: no CTA-wide barrier in the main loop, so a warp stalled on
//   memory never stalls the others. At 16 tokens per tile and 128 dims a stage is 8 KiB, and the
//   default per-warp budget (24 KiB) gives 3 stages: 2 CTAs x 4 warps x 2 tiles in flight = 128
//   KiB per H100/H200 SM, several times the bandwidth-latency product, on one code path that also
//   runs on sm_80. (TMA and wgmma would not help a kernel whose instruction count per byte is
//   already small; cp.async keeps sm_80 and sm_90 on the same code.)
// * Tensor cores for both products, so the CUDA cores do only the softmax. With h query heads,
//   decode costs h/2 FMA per KV byte; done in fp32 on CUDA cores that is a large fraction of the
//   SM's issue rate at H200 bandwidth for h >= 4, while one mma.m16n8k16 does 2048 FMAs. Both
//   products put the 16 tokens of a tile on the MMA's M axis and up to 8 query heads on N:
//     S^T[t][h] = K[t][:] . Q[h][:]    (A = K from ldmatrix, B = Q fragments held in registers)
//     O^T[d][h] += V^T[d][t] . P^T[t][h]  (A = V via ldmatrix.trans, B = P^T)
//   Heads on N (8 wide, not 16) halve the accumulator registers for groups of up to 8. The S^T
//   accumulator holds P^T in the C-fragment layout; movmatrix.trans turns it into the B fragment
//   of the second product without touching shared memory. P is rounded to bf16/fp16 for the MMA
//   as a hi + lo pair (two MMAs), so the weights keep ~16 significant bits: the result matches a
//   float64 reference as closely as fp32 CUDA-core arithmetic would, at a cost the tensor cores
//   absorb. Online softmax in fp32, in base 2 (scale * log2(e) folded into one multiply).
// * Shared-memory tiles are XOR-swizzled by 16-byte chunk (chunk ^ (row & 7)), so the eight
//   row addresses of every ldmatrix hit eight different bank groups.
// * Tokens past a context are never read: their rows are zero-filled by cp.async (src-size 0)
//   and their scores masked to -inf, so stale or NaN slots in a partly used block cannot leak in.
// * Split-K (flash-decoding): the grid's second axis is the number of splits, chosen on the host
//   from batch x KV heads x context, the device's SM count and the kernel's CTAs per SM (FA2's
//   wave-efficiency rule), so batch 1 at long contexts fills the GPU. Each sequence's context is
//   cut into that many 16-token-aligned parts on the device, from its own length: any split count
//   is correct for any lengths, so a CUDA graph captured with one count replays correctly for
//   every batch it is replayed on. Splits write a normalised partial output and its log-sum-exp
//   (base 2); a small second kernel merges them. One split writes the output directly.
// * At the end of a CTA its warps' partial results are combined in shared memory (each warp's
//   staging ring is reused for its fp32 accumulator), so a CTA writes one row per head.
//
// Build knobs (preprocessor defines; see llmconsole/kernels/cuda_build.py):
//   LLMC_WARP_REDUCE      1: the merge kernel reduces over splits with __shfl_xor_sync within
//                         warps, then across warps; 0: a shared-memory tree over the whole CTA.
//                         (The decode kernel's reductions are register shuffles inside MMA
//                         fragments either way.)
//   LLMC_SMEM_CARVEOUT_KB >0: ask for this much shared memory per SM (carve-out from L1) and allow
//                         that much dynamic shared memory per CTA; 0: driver defaults
//   LLMC_NUM_THREADS      threads per CTA, a multiple of 32 in [32, 256]: the number of warps
//                         streaming one CTA's context (and the merge kernel's block size)
//   LLMC_PARTITION_SIZE   smallest context split (tokens) the split chooser makes; larger means
//                         fewer partial results to merge, smaller fills the GPU sooner
//   LLMC_STAGE_BYTES      shared memory per warp for its ring of K/V stages (2..4 stages)
//   LLMC_LAUNCH_BOUNDS    1: __launch_bounds__(LLMC_NUM_THREADS) on the kernels. ptxas lets launch
//                         bounds override -maxrregcount, so a register cap needs 0.
//   LLMC_ONLY_HEAD_SIZE   0: instantiate head sizes 64, 128 and 256; N: only N (faster builds)
//   LLMC_FP8_KV           1: also instantiate the fp8 e4m3 KV kernels
// and nvcc flags: -maxrregcount=N caps registers; --use_fast_math turns exp2f/log2f into the
// approximate MUFU forms (ex2.approx.ftz).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <math_constants.h>
#include <stdint.h>

#ifndef LLMC_WARP_REDUCE
#define LLMC_WARP_REDUCE 1
#endif
#ifndef LLMC_SMEM_CARVEOUT_KB
#define LLMC_SMEM_CARVEOUT_KB 0
#endif
#ifndef LLMC_NUM_THREADS
#define LLMC_NUM_THREADS 128
#endif
#ifndef LLMC_PARTITION_SIZE
#define LLMC_PARTITION_SIZE 128
#endif
#ifndef LLMC_STAGE_BYTES
#define LLMC_STAGE_BYTES 24576
#endif
#ifndef LLMC_ONLY_HEAD_SIZE
#define LLMC_ONLY_HEAD_SIZE 0
#endif
#ifndef LLMC_FP8_KV
#define LLMC_FP8_KV 1
#endif

#ifndef LLMC_LAUNCH_BOUNDS
#define LLMC_LAUNCH_BOUNDS 1
#endif
#if LLMC_LAUNCH_BOUNDS
#define LLMC_BOUNDS __launch_bounds__(LLMC_NUM_THREADS)
#else
#define LLMC_BOUNDS
#endif

#define LLMC_STR2(x) #x
#define LLMC_STR(x) LLMC_STR2(x)

namespace llmc {

constexpr int kThreads = LLMC_NUM_THREADS;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 256,
              "LLMC_NUM_THREADS must be a multiple of 32 in [32, 256]");
constexpr int kTile = 16;               // tokens per warp tile: the M axis of one MMA
constexpr int kMaxSplits = 256;         // split-K partitions at most (merge smem: 4 B each)
constexpr int kMinPartition = LLMC_PARTITION_SIZE;
constexpr int kStageBudget = LLMC_STAGE_BYTES;
static_assert(kMinPartition >= kTile, "LLMC_PARTITION_SIZE must be at least one tile (16)");
constexpr float kLog2e = 1.4426950408889634f;

// Type codes of the C API.
constexpr int kBf16 = 1, kF16 = 2, kFp8E4m3 = 3;

// Compile-time geometry of one decode kernel: KvBytes bytes per cached element, head size D,
// NT n-tiles of 8 query heads. Mirrored in llmconsole/kernels/cuda_emulation.py
// (kernel_geometry), which the CPU suite checks against llmc_paged_attention_geometry().
template <int KvBytes, int D, int NT>
struct Geometry {
  static constexpr int kHeads = 8 * NT;                  // query heads per CTA
  static constexpr int kKvTileBytes = kTile * D * KvBytes;  // K (or V) of one tile, as stored
  // fp8 tiles are widened to 16 bits in a per-warp work tile before the MMAs read them.
  static constexpr int kWorkBytes = KvBytes == 1 ? 2 * kTile * D * 2 : 0;
  static constexpr int kStagesFit = (kStageBudget - kWorkBytes) / (2 * kKvTileBytes);
  static constexpr int kStages = kStagesFit < 2 ? 2 : (kStagesFit > 4 ? 4 : kStagesFit);
  static constexpr int kStageBytes = 2 * kKvTileBytes;   // K tile then V tile
  static constexpr int kWarpBytes = kStages * kStageBytes + kWorkBytes;
  static constexpr int kOStride = D + 4;                  // fp32 combine rows, padded for banks
  // Q fragments stay in registers unless that would spill (head 256 with 16 heads per CTA).
  static constexpr bool kQInSmem = D * NT >= 512;
  static constexpr int kQBytes = kHeads * D * 2;
  static constexpr int kCtaBytes = kWarps * kWarpBytes + kQBytes;
  static constexpr int kChunksPerRow = D * KvBytes / 16;  // 16-byte chunks per cached row
  static constexpr int kCopiesPerLane = kTile * kChunksPerRow / 32;
  static_assert(kTile * kChunksPerRow % 32 == 0, "a tile must be whole 16-byte chunks per lane");
  static_assert(kHeads * kOStride * 4 <= kWarpBytes, "the combine area must fit a warp's ring");
  static_assert(D % 32 == 0 && D * 2 / 16 >= 8, "the swizzle needs at least 8 chunks per row");
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a 16-bit tile with D columns, swizzled
// so the 8 rows one ldmatrix reads fall in 8 different bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr)
               : "memory");
}
// Transposes the 8x8 16-bit matrix a warp holds in the MMA fragment layout (lane l: row l/4,
// columns 2(l%4), 2(l%4)+1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The 16-bit type the MMAs run in: packing, unpacking and the m16n8k16 instruction.
template <typename M>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t x) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t x) {
    return __half22float2(*reinterpret_cast<const __half2*>(&x));
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The MMA type for a (query, KV) pair: the query's own type, or fp16 when the cache is fp8
// (e4m3 widens to fp16 exactly).
template <typename QT, typename KVT>
struct MmaTypeOf {
  using type = QT;
};
template <typename QT>
struct MmaTypeOf<QT, __nv_fp8_e4m3> {
  using type = __half;
};

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// 16 e4m3 values (one 16-byte chunk) -> 16 fp16 values (two chunks), exactly.
__device__ __forceinline__ void fp8x16_to_half(const uint4 raw, uint4& lo, uint4& hi) {
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(in[i] & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(in[i] >> 16), __NV_E4M3);
    out[2 * i] = uint32_t(a.x) | (uint32_t(a.y) << 16);
    out[2 * i + 1] = uint32_t(b.x) | (uint32_t(b.y) << 16);
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ static float identity() { return -CUDART_INF_F; }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ static float identity() { return 0.0f; }
};

#if LLMC_WARP_REDUCE
constexpr int kReduceSlots = kWarps;
#else
constexpr int kReduceSlots = kThreads;
#endif

// Reduces v over the CTA; every thread gets the result. `slots` is static shared memory.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* slots, Op op) {
  const int tid = threadIdx.x;
#if LLMC_WARP_REDUCE
  const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, mask));
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = lane < kWarps ? slots[lane] : Op::identity();
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, mask));
  __syncthreads();  // slots are reused by the next reduction
  return v;
#else
  slots[tid] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (tid < stride) slots[tid] = op(slots[tid], slots[tid + stride]);
    __syncthreads();
  }
  v = slots[0];
  __syncthreads();
  return v;
#endif
}

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const int* block_tables;
  const int* seq_lens;
  void* out;
  float* part_o;    // [num_seqs, num_heads, num_splits, head_size], normalised per split
  float* part_lse;  // [num_seqs, num_heads, num_splits], log2-sum-exp2 of the split's scores
  const float* k_scale;  // fp8 KV only: per-tensor dequantisation scales (device scalars)
  const float* v_scale;
  long long q_stride_seq, q_stride_head, o_stride_seq, o_stride_head;
  long long k_stride_block, k_stride_token, k_stride_head;
  long long v_stride_block, v_stride_token, v_stride_head;
  int num_seqs, num_heads, num_kv_heads, group, head_size, block_size, table_stride;
  int head_tiles, num_splits;
  float scale;
};

// Tokens per split for a context of `len`: the same count of 16-token-aligned parts for every
// sequence, each from its own length.
__host__ __device__ inline int split_tokens(int len, int num_splits) {
  const int per = (len + num_splits - 1) / num_splits;
  return (per + kTile - 1) / kTile * kTile;
}

template <typename QT, typename KVT, int D, int NT>
__global__ void LLMC_BOUNDS decode_kernel(const Params p) {
  using G = Geometry<int(sizeof(KVT)), D, NT>;
  using MT = typename MmaTypeOf<QT, KVT>::type;
  constexpr bool kFp8 = sizeof(KVT) == 1;
  constexpr int kHeads = G::kHeads;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;  // MMA fragment row group and column pair
  const int cta = blockIdx.x, split = blockIdx.y;
  const int head_tile = cta % p.head_tiles;
  const int kv_head = (cta / p.head_tiles) % p.num_kv_heads;
  const int seq = cta / (p.head_tiles * p.num_kv_heads);
  const int len = p.seq_lens[seq];
  const int per_split = split_tokens(len, p.num_splits);
  const int begin = split * per_split;
  const int end = min(len, begin + per_split);

  if (begin >= end && p.num_splits > 1) {
    // An empty split (a context shorter than the others): only its weight, zero, is written;
    // the merge skips it.
    for (int h = threadIdx.x; h < kHeads; h += kThreads) {
      const int hg = head_tile * kHeads + h;
      if (hg < p.group) {
        const long long row = ((long long)seq * p.num_heads + kv_head * p.group + hg) * p.num_splits + split;
        p.part_lse[row] = -CUDART_INF_F;
      }
    }
    return;
  }

  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float stat_m[kWarps][kHeads];
  __shared__ float stat_l[kWarps][kHeads];
  uint8_t* ring = smem + warp * G::kWarpBytes;
  uint8_t* q_s = smem + kWarps * G::kWarpBytes;

  // This warp's tiles: 16-token tiles warp, warp + kWarps, ... of [begin, end).
  const int num_tiles = end > begin ? (end - begin + kTile - 1) / kTile : 0;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp + kWarps - 1) / kWarps : 0;
  const int bs = p.block_size;
  const int* table = p.block_tables + (long long)seq * p.table_stride;
  // Block-table entries, 32 tiles per load: lane i holds the entry of tile base + i; the next
  // batch is fetched 32 tiles before it is needed.
  auto table_entry = [&](int i) { return i < my_tiles ? table[(begin + (warp + i * kWarps) * kTile) / bs] : 0; };
  int blk_cur = table_entry(lane);
  int blk_next = table_entry(32 + lane);

  const KVT* kbase = static_cast<const KVT*>(p.k) + (long long)kv_head * p.k_stride_head;
  const KVT* vbase = static_cast<const KVT*>(p.v) + (long long)kv_head * p.v_stride_head;

  // Queues tile i's K and V rows into stage i % kStages (one commit group per tile, empty when
  // past the warp's last tile, so group counting stays uniform).
  auto issue = [&](int i) {
    if (i < my_tiles) {
      if (i > 0 && (i & 31) == 0) {
        blk_cur = blk_next;
        blk_next = table_entry(i + 32 + lane);
      }
      const int block = __shfl_sync(0xffffffffu, blk_cur, i & 31);
      const int tok0 = begin + (warp + i * kWarps) * kTile;
      const int valid = min(kTile, len - tok0);
      const int row0 = tok0 % bs;
      const KVT* kb = kbase + (long long)block * p.k_stride_block + (long long)row0 * p.k_stride_token;
      const KVT* vb = vbase + (long long)block * p.v_stride_block + (long long)row0 * p.v_stride_token;
      uint8_t* stage = ring + (i % G::kStages) * G::kStageBytes;
#pragma unroll
      for (int u = 0; u < G::kCopiesPerLane; ++u) {
        const int c = lane + 32 * u;
        const int row = c / G::kChunksPerRow, ch = c % G::kChunksPerRow;
        const int bytes = row < valid ? 16 : 0;  // rows past the context: zero-filled, not read
        const int dst = kFp8 ? row * D + ch * 16 : swz<D>(row, ch);
        const KVT* ks = bytes ? kb + row * p.k_stride_token + ch * (16 / int(sizeof(KVT))) : kb;
        const KVT* vs = bytes ? vb + row * p.v_stride_token + ch * (16 / int(sizeof(KVT))) : vb;
        cp_async_16(smem_u32(stage + dst), ks, bytes);
        cp_async_16(smem_u32(stage + G::kKvTileBytes + dst), vs, bytes);
      }
    }
    cp_async_commit();
  };

  float m_run[NT][2], l_run[NT][2];
  float o[D / 16][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    m_run[nt][0] = m_run[nt][1] = -CUDART_INF_F;
    l_run[nt][0] = l_run[nt][1] = 0.0f;
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
  }

#pragma unroll
  for (int s = 0; s < G::kStages - 1; ++s) issue(s);

  // Q of the CTA's heads -> shared memory in the MMA type (rows past the group are zero), while the
  // first tiles' copies are in flight. With an fp8 cache the MMAs run in fp16 and the softmax
  // scale is applied here, before the rounding.
  const QT* q = static_cast<const QT*>(p.q);
  for (int c = threadIdx.x; c < kHeads * (D / 8); c += kThreads) {
    const int r = c / (D / 8), ch = c % (D / 8);
    const int hg = head_tile * kHeads + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (hg < p.group) {
      const QT* src = q + seq * p.q_stride_seq + (long long)(kv_head * p.group + hg) * p.q_stride_head + ch * 8;
      val = *reinterpret_cast<const uint4*>(src);  // 16-byte aligned: checked on the host
      if constexpr (kFp8) {
        const QT* e = reinterpret_cast<const QT*>(&val);
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[i] = Mma<MT>::pack(to_float(e[2 * i]) * p.scale, to_float(e[2 * i + 1]) * p.scale);
        val = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    *reinterpret_cast<uint4*>(q_s + swz<D>(r, ch)) = val;
  }
  float s_mul = p.scale * kLog2e, o_mul = 1.0f;
  if constexpr (kFp8) {
    s_mul = (p.k_scale ? *p.k_scale : 1.0f) * kLog2e;
    o_mul = p.v_scale ? *p.v_scale : 1.0f;
  }
  __syncthreads();

  // Q^T as the B operand of S^T = K Q^T: b0 = Q[h = 8nt + g][16j + 2tig, +1], b1 = the same 8
  // dimensions later. One ldmatrix.x4 over rows 8nt..8nt+7 yields two k-steps.
  uint32_t qf[G::kQInSmem ? 1 : NT][G::kQInSmem ? 1 : D / 16][2];
  if constexpr (!G::kQInSmem) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j2 = 0; j2 < D / 32; ++j2) {
        uint32_t r[4];
        ldsm_x4(smem_u32(q_s + swz<D>(nt * 8 + (lane & 7), 4 * j2 + (lane >> 3))), r);
        qf[nt][2 * j2][0] = r[0];
        qf[nt][2 * j2][1] = r[1];
        qf[nt][2 * j2 + 1][0] = r[2];
        qf[nt][2 * j2 + 1][1] = r[3];
      }
    }
  }

  for (int i = 0; i < my_tiles; ++i) {
    cp_async_wait<G::kStages - 2>();  // tile i has landed (this lane's copies) ...
    __syncwarp();                     // ... and every lane's; stage (i - 1) is free again
    issue(i + G::kStages - 1);

    const uint8_t* stage = ring + (i % G::kStages) * G::kStageBytes;
    const uint8_t* k_tile = stage;
    const uint8_t* v_tile = stage + G::kKvTileBytes;
    if constexpr (kFp8) {
      // Widen the fp8 tile to fp16 in the work tile, in the layout the 16-bit path reads.
      uint8_t* work = ring + G::kStages * G::kStageBytes;
#pragma unroll
      for (int u = 0; u < 2 * G::kCopiesPerLane; ++u) {
        const int c = lane + 32 * u;
        const int which = c / (kTile * G::kChunksPerRow);  // 0: K, 1: V
        const int cc = c % (kTile * G::kChunksPerRow);
        const int row = cc / G::kChunksPerRow, ch = cc % G::kChunksPerRow;
        const uint4 raw = *reinterpret_cast<const uint4*>(stage + which * G::kKvTileBytes + row * D + ch * 16);
        uint4 lo, hi;
        fp8x16_to_half(raw, lo, hi);
        uint8_t* dst = work + which * (kTile * D * 2);
        *reinterpret_cast<uint4*>(dst + swz<D>(row, 2 * ch)) = lo;
        *reinterpret_cast<uint4*>(dst + swz<D>(row, 2 * ch + 1)) = hi;
      }
      __syncwarp();
      k_tile = work;
      v_tile = work + kTile * D * 2;
    }
    const uint32_t k_addr = smem_u32(k_tile), v_addr = smem_u32(v_tile);
    const int tok0 = begin + (warp + i * kWarps) * kTile;
    const int valid = min(kTile, len - tok0);

    // S^T[t][h] = K[t] . Q[h]: A = K rows (ldmatrix matrices: rows 0-7 / 8-15 x chunks 2j, 2j+1).
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      uint32_t a[4];
      const int mi = lane >> 3;
      ldsm_x4(k_addr + swz<D>((mi & 1) * 8 + (lane & 7), 2 * j + (mi >> 1)), a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t b0, b1;
        if constexpr (G::kQInSmem) {
          ldsm_x2(smem_u32(q_s + swz<D>(nt * 8 + (lane & 7), 2 * j + ((lane >> 3) & 1))), b0, b1);
        } else {
          b0 = qf[nt][j][0];
          b1 = qf[nt][j][1];
        }
        Mma<MT>::mma(s[nt], a, b0, b1);
      }
    }

    // Online softmax per head column. This lane holds tokens g, g + 8 of heads 8nt + 2tig + {0,1}.
    const bool ok0 = g < valid, ok1 = g + 8 < valid;
    uint32_t p_hi[NT][2], p_lo[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float x0 = ok0 ? s[nt][0] * s_mul : -CUDART_INF_F;
      const float x1 = ok0 ? s[nt][1] * s_mul : -CUDART_INF_F;
      const float x2 = ok1 ? s[nt][2] * s_mul : -CUDART_INF_F;
      const float x3 = ok1 ? s[nt][3] * s_mul : -CUDART_INF_F;
      float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
      for (int mask = 4; mask < 32; mask <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, mask));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, mask));
      }
      const float mn0 = fmaxf(m_run[nt][0], mx0), mn1 = fmaxf(m_run[nt][1], mx1);
      const float al0 = exp2f(m_run[nt][0] - mn0), al1 = exp2f(m_run[nt][1] - mn1);
      m_run[nt][0] = mn0;
      m_run[nt][1] = mn1;
      const float p0 = exp2f(x0 - mn0), p1 = exp2f(x1 - mn1);
      const float p2 = exp2f(x2 - mn0), p3 = exp2f(x3 - mn1);
      l_run[nt][0] = l_run[nt][0] * al0 + (p0 + p2);
      l_run[nt][1] = l_run[nt][1] * al1 + (p1 + p3);
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        o[mt][nt][0] *= al0;
        o[mt][nt][1] *= al1;
        o[mt][nt][2] *= al0;
        o[mt][nt][3] *= al1;
      }
      // P^T in the C-fragment layout (rows t, columns h) -> hi + lo 16-bit pairs -> transposed
      // into the B fragment of O^T += V^T P^T (b0: tokens 2tig, 2tig+1 of head g; b1: +8).
      const uint32_t h01 = Mma<MT>::pack(p0, p1), h23 = Mma<MT>::pack(p2, p3);
      const float2 f01 = Mma<MT>::unpack(h01), f23 = Mma<MT>::unpack(h23);
      const uint32_t l01 = Mma<MT>::pack(p0 - f01.x, p1 - f01.y);
      const uint32_t l23 = Mma<MT>::pack(p2 - f23.x, p3 - f23.y);
      p_hi[nt][0] = movmatrix_trans(h01);
      p_hi[nt][1] = movmatrix_trans(h23);
      p_lo[nt][0] = movmatrix_trans(l01);
      p_lo[nt][1] = movmatrix_trans(l23);
    }

    // O^T[d][h] += V^T[d][t] P^T[t][h]: A = V^T by ldmatrix.trans (matrices: tokens 0-7 / 8-15
    // x chunks 2mt, 2mt+1).
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      uint32_t a[4];
      const int mi = lane >> 3;
      ldsm_x4_trans(v_addr + swz<D>((mi >> 1) * 8 + (lane & 7), 2 * mt + (mi & 1)), a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        Mma<MT>::mma(o[mt][nt], a, p_hi[nt][0], p_hi[nt][1]);
        Mma<MT>::mma(o[mt][nt], a, p_lo[nt][0], p_lo[nt][1]);
      }
    }
  }
  cp_async_wait<0>();

  // Row sums: each lane summed its own two tokens per tile; add across the 8 row groups.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int mask = 4; mask < 32; mask <<= 1)
        l_run[nt][c] += __shfl_xor_sync(0xffffffffu, l_run[nt][c], mask);
    }
  }

  // Combine the warps: each writes its unnormalised O (into its own ring) and (m, l) per head.
  __syncwarp();
  float* o_s = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
        o_s[(nt * 8 + 2 * tig + (r & 1)) * G::kOStride + mt * 16 + g + (r >> 1) * 8] = o[mt][nt][r];
    }
  }
  if (g == 0) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        stat_m[warp][nt * 8 + 2 * tig + c] = m_run[nt][c];
        stat_l[warp][nt * 8 + 2 * tig + c] = l_run[nt][c];
      }
    }
  }
  __syncthreads();

  QT* out = static_cast<QT*>(p.out);
  for (int idx = threadIdx.x; idx < kHeads * D; idx += kThreads) {
    const int h = idx / D, d = idx % D;
    const int hg = head_tile * kHeads + h;
    if (hg >= p.group) continue;
    float top = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, stat_m[w][h]);
    float total = 0.0f, acc = 0.0f;
    if (top != -CUDART_INF_F) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(stat_m[w][h] - top);  // 0 for a warp that had no tile
        total = fmaf(stat_l[w][h], f, total);
        acc = fmaf(reinterpret_cast<const float*>(smem + w * G::kWarpBytes)[h * G::kOStride + d], f, acc);
      }
    }
    const float res = total > 0.0f ? acc / total * o_mul : 0.0f;  // empty context: zeros
    const int head = kv_head * p.group + hg;
    if (p.num_splits == 1) {
      out[seq * p.o_stride_seq + head * p.o_stride_head + d] = from_float<QT>(res);
    } else {
      const long long row = ((long long)seq * p.num_heads + head) * p.num_splits + split;
      p.part_o[row * D + d] = res;
      if (d == 0) p.part_lse[row] = total > 0.0f ? top + log2f(total) : -CUDART_INF_F;
    }
  }
}

// Merges one (sequence, head)'s splits: out = sum_s o_s 2^lse_s / sum_s 2^lse_s. Dynamic
// shared memory holds one weight per split.
template <typename QT>
__global__ void LLMC_BOUNDS merge_kernel(const Params p) {
  const int row = blockIdx.x;  // seq * num_heads + head
  const int seq = row / p.num_heads, head = row % p.num_heads;
  extern __shared__ float weights[];
  __shared__ float slots[kReduceSlots];
  const float* lse = p.part_lse + (long long)row * p.num_splits;
  float m = -CUDART_INF_F;
  for (int i = threadIdx.x; i < p.num_splits; i += kThreads) m = fmaxf(m, lse[i]);
  const float top = block_reduce(m, slots, MaxOp());
  float sum = 0.0f;
  for (int i = threadIdx.x; i < p.num_splits; i += kThreads) {
    const float w = (top == -CUDART_INF_F || lse[i] == -CUDART_INF_F) ? 0.0f : exp2f(lse[i] - top);
    weights[i] = w;
    sum += w;
  }
  const float total = block_reduce(sum, slots, SumOp());  // its barrier publishes weights[]
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  const float* po = p.part_o + (long long)row * p.num_splits * p.head_size;
  QT* out = static_cast<QT*>(p.out);
  for (int d = threadIdx.x; d < p.head_size; d += kThreads) {
    float acc = 0.0f;
    for (int i = 0; i < p.num_splits; ++i) {
      const float w = weights[i];
      if (w > 0.0f) acc = fmaf(w, po[(long long)i * p.head_size + d], acc);  // skips unwritten splits
    }
    out[seq * p.o_stride_seq + head * p.o_stride_head + d] = from_float<QT>(acc * inv);
  }
}

// Allows `bytes` of dynamic shared memory for a kernel, and applies the carve-out knob. Done
// once per device and kernel (the attributes persist), so a launch under stream capture makes
// no attribute calls once the kernel has run eagerly.
template <typename Kernel>
cudaError_t prepare_smem(Kernel kernel, size_t bytes, unsigned long long* prepared) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = 1ull << (device & 63);
  if (*prepared & bit) return cudaSuccess;
  size_t allow = bytes;
#if LLMC_SMEM_CARVEOUT_KB > 0
  {
    int per_sm = 0, optin = 0;
    cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    const size_t want = size_t(LLMC_SMEM_CARVEOUT_KB) * 1024;
    if (per_sm > 0) {
      const int percent = int((want * 100 + per_sm - 1) / size_t(per_sm));
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 percent > 100 ? 100 : percent);
      if (err != cudaSuccess) return err;
    }
    const size_t cap = optin > 0 ? size_t(optin) : want;
    if (want > allow) allow = want < cap ? want : cap;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(allow));
  }
#else
  if (allow > 48 * 1024)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(allow));
#endif
  if (err == cudaSuccess) *prepared |= bit;
  return err;
}

template <typename QT, typename KVT, int D, int NT>
struct Launcher {
  using G = Geometry<int(sizeof(KVT)), D, NT>;
  static cudaError_t prepare() {
    static unsigned long long prepared = 0, merge_prepared = 0;
    cudaError_t err = prepare_smem(decode_kernel<QT, KVT, D, NT>, G::kCtaBytes, &prepared);
    if (err != cudaSuccess) return err;
    return prepare_smem(merge_kernel<QT>, sizeof(float) * kMaxSplits, &merge_prepared);
  }
  static cudaError_t launch(const Params& p, cudaStream_t stream) {
    cudaError_t err = prepare();
    if (err != cudaSuccess) return err;
    const dim3 grid(unsigned(p.num_seqs) * p.num_kv_heads * p.head_tiles, unsigned(p.num_splits));
    decode_kernel<QT, KVT, D, NT><<<grid, kThreads, G::kCtaBytes, stream>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess || p.num_splits == 1) return err;
    merge_kernel<QT><<<unsigned(p.num_seqs) * p.num_heads, kThreads, sizeof(float) * p.num_splits, stream>>>(p);
    return cudaGetLastError();
  }
  static cudaError_t occupancy(int* ctas) {
    cudaError_t err = prepare();
    if (err != cudaSuccess) return err;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, decode_kernel<QT, KVT, D, NT>, kThreads,
                                                         G::kCtaBytes);
  }
};

// Calls F::template run<QT, KVT, D, NT>() for the runtime (dtype, kv_dtype, head_size, group);
// returns cudaErrorInvalidValue for a combination this build does not instantiate.
template <typename F, typename QT, typename KVT, int D>
cudaError_t by_nt(int group, F& f) {
  return group <= 8 ? f.template run<QT, KVT, D, 1>() : f.template run<QT, KVT, D, 2>();
}

template <typename F, typename QT, typename KVT>
cudaError_t by_head(int head_size, int group, F& f) {
  switch (head_size) {
#if LLMC_ONLY_HEAD_SIZE == 0 || LLMC_ONLY_HEAD_SIZE == 64
    case 64:
      return by_nt<F, QT, KVT, 64>(group, f);
#endif
#if LLMC_ONLY_HEAD_SIZE == 0 || LLMC_ONLY_HEAD_SIZE == 128
    case 128:
      return by_nt<F, QT, KVT, 128>(group, f);
#endif
#if LLMC_ONLY_HEAD_SIZE == 0 || LLMC_ONLY_HEAD_SIZE == 256
    case 256:
      return by_nt<F, QT, KVT, 256>(group, f);
#endif
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename F>
cudaError_t dispatch(int dtype, int kv_dtype, int head_size, int group, F& f) {
  if (dtype == kBf16 && kv_dtype == kBf16) return by_head<F, __nv_bfloat16, __nv_bfloat16>(head_size, group, f);
  if (dtype == kF16 && kv_dtype == kF16) return by_head<F, __half, __half>(head_size, group, f);
#if LLMC_FP8_KV
  if (dtype == kBf16 && kv_dtype == kFp8E4m3) return by_head<F, __nv_bfloat16, __nv_fp8_e4m3>(head_size, group, f);
  if (dtype == kF16 && kv_dtype == kFp8E4m3) return by_head<F, __half, __nv_fp8_e4m3>(head_size, group, f);
#endif
  return cudaErrorInvalidValue;
}

struct LaunchOp {
  const Params& p;
  cudaStream_t stream;
  template <typename QT, typename KVT, int D, int NT>
  cudaError_t run() { return Launcher<QT, KVT, D, NT>::launch(p, stream); }
};
struct OccupancyOp {
  int* ctas;
  template <typename QT, typename KVT, int D, int NT>
  cudaError_t run() { return Launcher<QT, KVT, D, NT>::occupancy(ctas); }
};
struct SupportedOp {
  template <typename QT, typename KVT, int D, int NT>
  cudaError_t run() { return cudaSuccess; }
};

template <int KvBytes, int D, int NT>
void geometry_values(int* v) {
  using G = Geometry<KvBytes, D, NT>;
  v[0] = kTile;
  v[1] = kWarps;
  v[2] = G::kStages;
  v[3] = G::kHeads;
  v[4] = G::kQInSmem ? 1 : 0;
  v[5] = G::kWarpBytes;
  v[6] = G::kCtaBytes;
  v[7] = kMinPartition;
  v[8] = kMaxSplits;
  v[9] = int(sizeof(float) * 2 * kWarps * G::kHeads);  // static shared memory (stat_m, stat_l)
}

template <int KvBytes, int D>
int geometry_nt(int group, int* v) {
  if (group <= 8) geometry_values<KvBytes, D, 1>(v);
  else geometry_values<KvBytes, D, 2>(v);
  return 0;
}

template <int KvBytes>
int geometry_head(int head_size, int group, int* v) {
  switch (head_size) {
    case 64:
      return geometry_nt<KvBytes, 64>(group, v);
    case 128:
      return geometry_nt<KvBytes, 128>(group, v);
    case 256:
      return geometry_nt<KvBytes, 256>(group, v);
    default:
      return -1;
  }
}

int heads_per_cta(int group) { return group <= 8 ? 8 : 16; }

// The split count: one split while batch x KV heads (x head tiles) already gives ~a wave of
// CTAs; otherwise the smallest count whose wave efficiency (CTAs / whole waves of CTA slots) is
// within 10% of the best count's, at most one split per kMinPartition tokens of the longest
// context. Mirrored in llmconsole/kernels/cuda_emulation.py (choose_splits).
int choose_splits(int num_seqs, int num_kv_heads, int head_tiles, int max_context_len,
                  int sm_count, int ctas_per_sm) {
  if (num_seqs <= 0 || num_kv_heads <= 0 || head_tiles <= 0 || max_context_len <= 0) return 1;
  const long long base = (long long)num_seqs * num_kv_heads * head_tiles;
  const long long slots = (long long)(sm_count > 0 ? sm_count : 1) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  int cap = (max_context_len + kMinPartition - 1) / kMinPartition;
  if (cap > kMaxSplits) cap = kMaxSplits;
  if (cap <= 1 || base * 10 >= slots * 8) return 1;
  double best = 0.0;
  for (int s = 1; s <= cap; ++s) {
    const long long ctas = base * s;
    const long long waves = (ctas + slots - 1) / slots;
    const double eff = double(ctas) / double(waves * slots);
    if (eff > best) best = eff;
  }
  for (int s = 1; s <= cap; ++s) {
    const long long ctas = base * s;
    const long long waves = (ctas + slots - 1) / slots;
    if (double(ctas) / double(waves * slots) >= 0.9 * best) return s;
  }
  return cap;
}

}  // namespace llmc

using namespace llmc;

extern "C" {

// 1 when this build has a kernel for (head_size, dtype, kv_dtype); dtype codes: 1 = bf16,
// 2 = fp16, 3 = fp8 e4m3 (KV only).
int llmc_paged_attention_supports(int head_size, int dtype, int kv_dtype) {
  SupportedOp op;
  return dispatch(dtype, kv_dtype, head_size, 1, op) == cudaSuccess ? 1 : 0;
}

// The compile-time geometry of the kernel for (head_size, group, kv_dtype), into v[0..9]:
// tile tokens, warps per CTA, stages per warp, query heads per CTA, Q fragments in shared memory
// (0/1), shared memory per warp, dynamic shared memory per CTA, smallest split (tokens), most
// splits, static shared memory. Returns 0, or -1 for an unknown head size.
int llmc_paged_attention_geometry(int head_size, int group, int kv_dtype, int* v) {
  return kv_dtype == kFp8E4m3 ? geometry_head<1>(head_size, group, v) : geometry_head<2>(head_size, group, v);
}

// The split count the kernel uses when the caller passes none (no CUDA calls: testable anywhere).
int llmc_paged_attention_choose_splits(int num_seqs, int num_heads, int num_kv_heads,
                                       int max_context_len, int sm_count, int ctas_per_sm) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return 1;
  const int group = num_heads / num_kv_heads;
  const int per = heads_per_cta(group);
  return choose_splits(num_seqs, num_kv_heads, (group + per - 1) / per, max_context_len, sm_count,
                       ctas_per_sm);
}

// Decode CTAs resident per SM on the current device (the occupancy API, after the kernel's
// shared-memory attributes are set); a negative value is -cudaError_t.
int llmc_paged_attention_ctas_per_sm(int head_size, int num_heads, int num_kv_heads, int dtype,
                                     int kv_dtype) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return -int(cudaErrorInvalidValue);
  int ctas = 0;
  OccupancyOp op{&ctas};
  const cudaError_t err = dispatch(dtype, kv_dtype, head_size, num_heads / num_kv_heads, op);
  return err == cudaSuccess ? ctas : -int(err);
}

// Bytes of device workspace a launch with num_splits > 1 needs (0 for one split).
size_t llmc_paged_attention_workspace_bytes(int num_seqs, int num_heads, int head_size,
                                            int num_splits) {
  if (num_splits <= 1 || num_seqs <= 0) return 0;
  const size_t rows = size_t(num_seqs) * num_heads * num_splits;
  return sizeof(float) * (rows * head_size + rows);
}

// Decode attention on vLLM's CUDA KV layout (see the top of this file). Strides are in elements.
// key/value: [num_blocks, block_size, num_kv_heads, head_size] with strides (block, token, head)
// and a contiguous last axis; block_tables int32 rows of table_stride entries; seq_lens int32.
// k_scale/v_scale: device float scalars for an fp8 cache (may be null: 1.0), unused otherwise.
// num_splits in [1, 256]; more than one needs llmc_paged_attention_workspace_bytes() of
// workspace. Returns a cudaError_t (0 on success), or -1 for bad arguments.
int llmc_paged_attention_decode(void* out, const void* query, const void* key_cache,
                                const void* value_cache, const int* block_tables,
                                const int* seq_lens, int num_seqs, int num_heads,
                                int num_kv_heads, int head_size, int block_size, int table_stride,
                                long long q_stride_seq, long long q_stride_head,
                                long long out_stride_seq, long long out_stride_head,
                                long long k_stride_block, long long k_stride_token,
                                long long k_stride_head, long long v_stride_block,
                                long long v_stride_token, long long v_stride_head, float scale,
                                int dtype, int kv_dtype, const float* k_scale,
                                const float* v_scale, int num_splits, void* workspace,
                                size_t workspace_bytes, void* stream) {
  if (num_seqs <= 0) return 0;
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0 || block_size <= 0 ||
      block_size % kTile != 0 || num_splits < 1 || num_splits > kMaxSplits ||
      !llmc_paged_attention_supports(head_size, dtype, kv_dtype))
    return -1;
  // 16-byte copies need 16-byte aligned rows: pointers, and strides in whole 16-byte chunks.
  const long long kv_align = kv_dtype == kFp8E4m3 ? 16 : 8, q_align = 8;
  const long long strides[] = {k_stride_block, k_stride_token, k_stride_head,
                               v_stride_block, v_stride_token, v_stride_head};
  for (long long s : strides)
    if (s % kv_align != 0) return -1;
  if (q_stride_seq % q_align != 0 || q_stride_head % q_align != 0) return -1;
  if ((reinterpret_cast<uintptr_t>(query) | reinterpret_cast<uintptr_t>(key_cache) |
       reinterpret_cast<uintptr_t>(value_cache)) % 16 != 0)
    return -1;
  const int group = num_heads / num_kv_heads;
  const int per = heads_per_cta(group);
  Params p{};
  p.q = query;
  p.k = key_cache;
  p.v = value_cache;
  p.block_tables = block_tables;
  p.seq_lens = seq_lens;
  p.out = out;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.q_stride_seq = q_stride_seq;
  p.q_stride_head = q_stride_head;
  p.o_stride_seq = out_stride_seq;
  p.o_stride_head = out_stride_head;
  p.k_stride_block = k_stride_block;
  p.k_stride_token = k_stride_token;
  p.k_stride_head = k_stride_head;
  p.v_stride_block = v_stride_block;
  p.v_stride_token = v_stride_token;
  p.v_stride_head = v_stride_head;
  p.num_seqs = num_seqs;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.group = group;
  p.head_size = head_size;
  p.block_size = block_size;
  p.table_stride = table_stride;
  p.head_tiles = (group + per - 1) / per;
  p.num_splits = num_splits;
  p.scale = scale;
  if ((long long)num_seqs * num_kv_heads * p.head_tiles > 0x7fffffffLL) return -1;
  if (num_splits > 1) {
    const size_t need = llmc_paged_attention_workspace_bytes(num_seqs, num_heads, head_size, num_splits);
    if (workspace == nullptr || workspace_bytes < need ||
        reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return -1;
    const size_t rows = size_t(num_seqs) * num_heads * num_splits;
    p.part_o = static_cast<float*>(workspace);
    p.part_lse = p.part_o + rows * head_size;
  }
  LaunchOp op{p, static_cast<cudaStream_t>(stream)};
  return int(dispatch(dtype, kv_dtype, head_size, group, op));
}

// The knobs this library was built with, for the resource report and for logs.
const char* llmc_paged_attention_build_options(void) {
  return "LLMC_WARP_REDUCE=" LLMC_STR(LLMC_WARP_REDUCE) " LLMC_SMEM_CARVEOUT_KB=" LLMC_STR(
      LLMC_SMEM_CARVEOUT_KB) " LLMC_NUM_THREADS=" LLMC_STR(LLMC_NUM_THREADS)
      " LLMC_PARTITION_SIZE=" LLMC_STR(LLMC_PARTITION_SIZE) " LLMC_STAGE_BYTES=" LLMC_STR(
          LLMC_STAGE_BYTES) " LLMC_LAUNCH_BOUNDS=" LLMC_STR(LLMC_LAUNCH_BOUNDS)
      " LLMC_ONLY_HEAD_SIZE=" LLMC_STR(LLMC_ONLY_HEAD_SIZE) " LLMC_FP8_KV=" LLMC_STR(LLMC_FP8_KV);
}

const char* llmc_cuda_error_string(int code) {
  if (code == -1) return "invalid argument to llmc_paged_attention_decode";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // extern "C"
