// Paged-attention decode for NVIDIA GPUs (sm_80 and later): the CPU kernel's algorithm, on
// the same KV layout, so one reference and one set of test inputs serve both.
//
// Layout per (block, kv_head) slab of 2 * block_size * head_size elements:
//     K transposed [head_size][block_size], then V [block_size][head_size]
// (vLLM's CPU layout). Transposed K makes q.K coalesced with one thread per token: the
// threads of a warp read consecutive tokens of the same K row. V rows are read with one
// thread per output dimension, also coalesced.
//
// Grid: (query-head tile, sequence, partition). A CTA handles HEADS query heads that share
// one kv head, over one partition of the context (flash-decoding); with more than one
// partition a second kernel merges the partial results by log-sum-exp.
//
// Build knobs (preprocessor defines; see llmconsole/kernels/cuda_build.py):
//   LLMC_WARP_REDUCE      1: reductions by __shfl_xor_sync within warps, then across warps;
//                         0: a shared-memory tree over the whole CTA (more smem, more barriers)
//   LLMC_SMEM_CARVEOUT_KB >0: ask for this much shared memory per SM (carve-out from L1) and
//                         allow that much dynamic shared memory per CTA; 0: driver defaults
//   LLMC_NUM_THREADS      threads per CTA (a multiple of 32)
//   LLMC_PARTITION_SIZE   default tokens per partition; longer contexts are split
//   LLMC_LAUNCH_BOUNDS    1: __launch_bounds__(LLMC_NUM_THREADS) on the kernels. ptxas lets
//                         launch bounds override -maxrregcount, so a register cap needs 0.
// and nvcc flags: -maxrregcount=N caps registers; --use_fast_math turns expf into __expf.

#include <cuda_bf16.h>
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
#define LLMC_PARTITION_SIZE 512
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
static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024,
              "LLMC_NUM_THREADS must be a multiple of 32 in [32, 1024]");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
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
  const void* query;
  const void* kv_cache;
  const int* block_tables;
  const int* context_lens;
  void* out;
  float* part_out;  // [num_seqs, num_heads, max_parts, head_size], unnormalised
  float* part_max;  // [num_seqs, num_heads, max_parts]
  float* part_sum;  // [num_seqs, num_heads, max_parts]
  int num_heads, num_kv_heads, group, head_size, block_size, max_blocks;
  long long q_stride_seq, q_stride_head, out_stride_seq, out_stride_head;
  float scale;
  int partition_size, max_parts;
};

// Dynamic shared memory: q [HEADS][head_size], logits [HEADS][partition_size] and the p.V
// partial sums [token_groups][HEADS][head_size].
__host__ __device__ inline int token_groups(int head_size) {
  return head_size >= kThreads ? 1 : kThreads / head_size;
}
__host__ __device__ inline size_t decode_smem_bytes(int heads, int head_size, int partition) {
  return sizeof(float) * (size_t(heads) * head_size + size_t(heads) * partition +
                          size_t(token_groups(head_size)) * heads * head_size);
}

template <typename T, int HEADS>
__global__ void LLMC_BOUNDS llmc_decode_kernel(Params p) {
  const int head_tile = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int tid = threadIdx.x;
  const int first_head = head_tile * HEADS;
  const int kv_head = first_head / p.group;
  const int len = p.context_lens[seq];
  const int num_parts = len == 0 ? 1 : (len + p.partition_size - 1) / p.partition_size;
  if (part >= num_parts) return;
  if (num_parts > p.max_parts) {
    // The caller's max_context_len understated this context: there is no workspace for its
    // partitions. Refuse visibly (NaN) instead of writing past the workspace.
    if (part == 0) {
      T* out = static_cast<T*>(p.out);
      for (int i = tid; i < HEADS * p.head_size; i += kThreads) {
        const int g = i / p.head_size, d = i - g * p.head_size;
        out[seq * p.out_stride_seq + (first_head + g) * p.out_stride_head + d] =
            from_float<T>(CUDART_NAN_F);
      }
    }
    return;
  }
  const int begin = part * p.partition_size;
  const int n = min(len, begin + p.partition_size) - begin;
  const int H = p.head_size, bs = p.block_size;

  extern __shared__ float smem[];
  float* q_s = smem;
  float* logits = q_s + HEADS * H;
  float* pv_s = logits + HEADS * p.partition_size;
  __shared__ float slots[kReduceSlots];

  const T* query = static_cast<const T*>(p.query);
  for (int i = tid; i < HEADS * H; i += kThreads) {
    const int g = i / H, d = i - g * H;
    q_s[i] = to_float(query[seq * p.q_stride_seq + (first_head + g) * p.q_stride_head + d]) *
             p.scale;
  }
  __syncthreads();

  const T* kv = static_cast<const T*>(p.kv_cache);
  const int* table = p.block_tables + (long long)seq * p.max_blocks;
  const long long slab = 2LL * bs * H;

  // q.K: one token per thread, all HEADS heads at once so each K element is read once.
  float local_max[HEADS];
#pragma unroll
  for (int g = 0; g < HEADS; ++g) local_max[g] = -CUDART_INF_F;
  for (int t = tid; t < n; t += kThreads) {
    const int tok = begin + t;
    const T* k = kv + ((long long)table[tok / bs] * p.num_kv_heads + kv_head) * slab + tok % bs;
    float acc[HEADS];
#pragma unroll
    for (int g = 0; g < HEADS; ++g) acc[g] = 0.0f;
    for (int d = 0; d < H; ++d) {
      const float kd = to_float(k[(long long)d * bs]);
#pragma unroll
      for (int g = 0; g < HEADS; ++g) acc[g] = fmaf(q_s[g * H + d], kd, acc[g]);
    }
#pragma unroll
    for (int g = 0; g < HEADS; ++g) {
      logits[g * p.partition_size + t] = acc[g];
      local_max[g] = fmaxf(local_max[g], acc[g]);
    }
  }
  float row_max[HEADS], row_sum[HEADS];
#pragma unroll
  for (int g = 0; g < HEADS; ++g) row_max[g] = block_reduce(local_max[g], slots, MaxOp());

  // Softmax numerators; masking is by loop bounds, so slots past the context are never read.
#pragma unroll
  for (int g = 0; g < HEADS; ++g) row_sum[g] = 0.0f;
  for (int t = tid; t < n; t += kThreads) {
#pragma unroll
    for (int g = 0; g < HEADS; ++g) {
      const float e = expf(logits[g * p.partition_size + t] - row_max[g]);
      logits[g * p.partition_size + t] = e;
      row_sum[g] += e;
    }
  }
#pragma unroll
  for (int g = 0; g < HEADS; ++g) row_sum[g] = block_reduce(row_sum[g], slots, SumOp());

  // p.V: one output dimension per thread; when head_size < threads, several token groups
  // share the work and are summed below.
  const int groups = token_groups(H);
  for (int w = tid; w < groups * H; w += kThreads) {
    const int d = w % H, tg = w / H;
    float acc[HEADS];
#pragma unroll
    for (int g = 0; g < HEADS; ++g) acc[g] = 0.0f;
    for (int t = tg; t < n; t += groups) {
      const int tok = begin + t;
      const T* v = kv + ((long long)table[tok / bs] * p.num_kv_heads + kv_head) * slab +
                   (long long)bs * H + (long long)(tok % bs) * H + d;
      const float vd = to_float(*v);
#pragma unroll
      for (int g = 0; g < HEADS; ++g) acc[g] = fmaf(logits[g * p.partition_size + t], vd, acc[g]);
    }
#pragma unroll
    for (int g = 0; g < HEADS; ++g) pv_s[(tg * HEADS + g) * H + d] = acc[g];
  }
  __syncthreads();

  for (int i = tid; i < HEADS * H; i += kThreads) {
    const int g = i / H, d = i - g * H;
    float sum = 0.0f;
    for (int tg = 0; tg < groups; ++tg) sum += pv_s[(tg * HEADS + g) * H + d];
    const int head = first_head + g;
    // g is not a compile-time index here; selecting keeps row_max/row_sum in registers.
    float total = 0.0f, top = 0.0f;
#pragma unroll
    for (int gg = 0; gg < HEADS; ++gg) {
      if (gg == g) {
        total = row_sum[gg];
        top = row_max[gg];
      }
    }
    if (num_parts == 1) {
      // A zero-length context has nothing to attend to; it yields zeros, not 0/0.
      T* out = static_cast<T*>(p.out);
      out[seq * p.out_stride_seq + head * p.out_stride_head + d] =
          from_float<T>(total > 0.0f ? sum / total : 0.0f);
    } else {
      const long long row = ((long long)seq * p.num_heads + head) * p.max_parts + part;
      p.part_out[row * H + d] = sum;
      if (d == 0) {
        p.part_max[row] = top;
        p.part_sum[row] = total;
      }
    }
  }
}

// Merges the partitions of one (sequence, head) by log-sum-exp; dynamic shared memory holds one
// weight per partition.
template <typename T>
__global__ void LLMC_BOUNDS llmc_merge_kernel(Params p) {
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int len = p.context_lens[seq];
  const int num_parts = len == 0 ? 1 : (len + p.partition_size - 1) / p.partition_size;
  // One partition was written directly by the decode kernel; too many was refused there.
  if (num_parts == 1 || num_parts > p.max_parts) return;
  extern __shared__ float weights[];
  __shared__ float slots[kReduceSlots];
  const long long base = ((long long)seq * p.num_heads + head) * p.max_parts;

  float m = -CUDART_INF_F;
  for (int i = tid; i < num_parts; i += kThreads) m = fmaxf(m, p.part_max[base + i]);
  const float global_max = block_reduce(m, slots, MaxOp());
  float s = 0.0f;
  for (int i = tid; i < num_parts; i += kThreads) {
    const float w = expf(p.part_max[base + i] - global_max);
    weights[i] = w;
    s += w * p.part_sum[base + i];
  }
  const float total = block_reduce(s, slots, SumOp());  // its barrier publishes weights[]
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  T* out = static_cast<T*>(p.out);
  for (int d = tid; d < p.head_size; d += kThreads) {
    float acc = 0.0f;
    for (int i = 0; i < num_parts; ++i) acc = fmaf(weights[i], p.part_out[(base + i) * p.head_size + d], acc);
    out[seq * p.out_stride_seq + head * p.out_stride_head + d] = from_float<T>(acc * inv);
  }
}

// Allows `bytes` of dynamic shared memory for a kernel, and applies the carve-out knob.
template <typename Kernel>
cudaError_t prepare_smem(Kernel kernel, size_t bytes) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
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
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(allow));
  }
#else
  if (allow > 48 * 1024)
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(allow));
  return cudaSuccess;
#endif
}

template <typename T, int HEADS>
cudaError_t launch_typed(const Params& p, int num_seqs, cudaStream_t stream) {
  const size_t smem = decode_smem_bytes(HEADS, p.head_size, p.partition_size);
  cudaError_t err = prepare_smem(llmc_decode_kernel<T, HEADS>, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_heads / HEADS, num_seqs, p.max_parts);
  llmc_decode_kernel<T, HEADS><<<grid, kThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.max_parts == 1) return err;
  const size_t merge_smem = sizeof(float) * p.max_parts;
  err = prepare_smem(llmc_merge_kernel<T>, merge_smem);
  if (err != cudaSuccess) return err;
  llmc_merge_kernel<T><<<dim3(p.num_heads, num_seqs), kThreads, merge_smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_heads(const Params& p, int num_seqs, cudaStream_t stream) {
  // The widest head tile that divides the GQA group; any group size works, wider tiles read
  // each K/V element for more heads at once.
  if (p.group % 8 == 0) return launch_typed<T, 8>(p, num_seqs, stream);
  if (p.group % 4 == 0) return launch_typed<T, 4>(p, num_seqs, stream);
  if (p.group % 2 == 0) return launch_typed<T, 2>(p, num_seqs, stream);
  return launch_typed<T, 1>(p, num_seqs, stream);
}

int parts_for(int max_context_len, int partition_size) {
  return max_context_len <= partition_size ? 1
                                           : (max_context_len + partition_size - 1) / partition_size;
}

}  // namespace llmc

using namespace llmc;

extern "C" {

// Bytes of device workspace llmc_paged_attention_decode needs (0 when no context is split).
size_t llmc_paged_attention_workspace_bytes(int num_seqs, int num_heads, int head_size,
                                            int max_context_len, int partition_size) {
  const int partition = partition_size > 0 ? partition_size : LLMC_PARTITION_SIZE;
  const int parts = parts_for(max_context_len, partition);
  if (parts == 1) return 0;
  const size_t rows = size_t(num_seqs) * num_heads * parts;
  return sizeof(float) * (rows * head_size + 2 * rows);
}

// Decode attention. dtype: 0 = float32, 1 = bfloat16 (query, kv_cache and out alike).
// block_tables int32 [num_seqs, max_blocks_per_seq]; context_lens int32 [num_seqs], each at
// most max_context_len. Returns a cudaError_t (0 on success); -1 for bad arguments.
int llmc_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                const int* block_tables, const int* context_lens, int num_seqs,
                                int num_heads, int num_kv_heads, int head_size, int block_size,
                                int max_blocks_per_seq, int max_context_len,
                                long long q_stride_seq, long long q_stride_head,
                                long long out_stride_seq, long long out_stride_head, float scale,
                                int dtype, int partition_size, void* workspace,
                                size_t workspace_bytes, void* stream) {
  if (num_seqs <= 0) return 0;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || head_size <= 0 || block_size <= 0 ||
      (dtype != 0 && dtype != 1))
    return -1;
  Params p{};
  p.query = query;
  p.kv_cache = kv_cache;
  p.block_tables = block_tables;
  p.context_lens = context_lens;
  p.out = out;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.group = num_heads / num_kv_heads;
  p.head_size = head_size;
  p.block_size = block_size;
  p.max_blocks = max_blocks_per_seq;
  p.q_stride_seq = q_stride_seq;
  p.q_stride_head = q_stride_head;
  p.out_stride_seq = out_stride_seq;
  p.out_stride_head = out_stride_head;
  p.scale = scale;
  p.partition_size = partition_size > 0 ? partition_size : LLMC_PARTITION_SIZE;
  p.max_parts = parts_for(max_context_len, p.partition_size);
  if (p.max_parts > 1) {
    const size_t need = llmc_paged_attention_workspace_bytes(num_seqs, num_heads, head_size,
                                                             max_context_len, p.partition_size);
    if (workspace == nullptr || workspace_bytes < need) return -1;
    const size_t rows = size_t(num_seqs) * num_heads * p.max_parts;
    p.part_out = static_cast<float*>(workspace);
    p.part_max = p.part_out + rows * head_size;
    p.part_sum = p.part_max + rows;
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const cudaError_t err = dtype == 0 ? launch_heads<float>(p, num_seqs, s)
                                     : launch_heads<__nv_bfloat16>(p, num_seqs, s);
  return int(err);
}

// The knobs this library was built with, for the resource report and for logs.
const char* llmc_paged_attention_build_options(void) {
  return "LLMC_WARP_REDUCE=" LLMC_STR(LLMC_WARP_REDUCE) " LLMC_SMEM_CARVEOUT_KB=" LLMC_STR(
      LLMC_SMEM_CARVEOUT_KB) " LLMC_NUM_THREADS=" LLMC_STR(LLMC_NUM_THREADS)
      " LLMC_PARTITION_SIZE=" LLMC_STR(LLMC_PARTITION_SIZE) " LLMC_LAUNCH_BOUNDS=" LLMC_STR(
          LLMC_LAUNCH_BOUNDS);
}

const char* llmc_cuda_error_string(int code) {
  if (code == -1) return "invalid argument to llmc_paged_attention_decode";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // extern "C"
