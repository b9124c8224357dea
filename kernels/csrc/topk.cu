// Single-pass top-k + log-sum-exp over logits rows (fp32/bf16/fp16).
//
// Each row is split into `splits` chunks so that small batches still fill the GPU. A block reads
// its chunk once with 16-byte loads (a short scalar head brings unaligned rows to 16 bytes) and
// keeps an online (max, sum of exp) pair per thread. Selection is threshold-based: every element
// is compared once against a warp threshold, the larger of
//   - the warp's own k-th best so far, and
//   - a block-shared value that the block already holds k entries at or above (seeded before the
//     pass from the k-th largest of each warp's lane maxima over the first tile).
// The rare elements that pass go, by shared-memory atomics, into a per-warp shared buffer; when
// a few dozen candidates have piled up the warp selects its k best with warp-wide max
// reductions and raises its threshold. Warps merge
// through shared memory; with several splits a one-warp-per-row kernel merges the partial lists
// and sums. Order: larger logit first, ties to the smaller token id, compared exactly on
// (order-preserving key, id), so the result equals a stable sort.
#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSplits = 32;
constexpr int kMaxK = 16;
constexpr int kBuf = 320;  // per-warp candidates: the k best so far + up to 47 + one step's 256
constexpr unsigned kPadKey = 0u;  // below every real key (the key of a NaN bit pattern)
constexpr int kPadId = INT_MAX;
constexpr unsigned kNegInfKey = 0x007fffffu;  // key(-inf)

// Order-preserving map float -> uint32 (larger float, larger key); -0 maps to +0's key so that
// the two tie as they do in a float compare.
__device__ __forceinline__ unsigned to_key(float x) {
  const unsigned u = __float_as_uint(x);
  const unsigned k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k == 0x7fffffffu ? 0x80000000u : k;
}

__device__ __forceinline__ float from_key(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ bool kbetter(unsigned a, int ai, unsigned b, int bi) {
  return a > b || (a == b && ai < bi);
}

__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
#endif
}

__device__ __forceinline__ unsigned warp_min_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_min_sync(kFullMask, v);
#else
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct Selected {
  unsigned key;  // lane r < k: the r-th best entry
  int id;
  unsigned kth_key;  // every lane: the k-th best (pad if fewer than k entries)
  int kth_id;
};

// Warp-wide: the k best of n (key, id) entries (n <= 32 * SLOTS; all lanes call it with the same
// n and k). Lane r < k gets the r-th best. Missing entries come back as pads.
template <int SLOTS>
__device__ __forceinline__ Selected warp_select(const unsigned* keys, const int* ids, int n, int k,
                                                int lane) {
  unsigned key[SLOTS];
  int id[SLOTS];
  unsigned bk = kPadKey;
  int bi = kPadId;
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    key[s] = kPadKey;
    id[s] = kPadId;
    if (s * 32 < n) {
      const int idx = s * 32 + lane;
      if (idx < n) {
        key[s] = keys[idx];
        id[s] = ids[idx];
      }
      if (kbetter(key[s], id[s], bk, bi)) { bk = key[s]; bi = id[s]; }
    }
  }
  Selected out{kPadKey, kPadId, kPadKey, kPadId};
  for (int r = 0; r < k; ++r) {
    const unsigned wk = warp_max_u32(bk);
    const int wi = static_cast<int>(warp_min_u32(bk == wk ? static_cast<unsigned>(bi) : 0xffffffffu));
    if (lane == r) { out.key = wk; out.id = wi; }
    out.kth_key = wk;
    out.kth_id = wi;
    if (bk == wk && bi == wi) {  // this lane held the winner: drop it, find its next best
      unsigned nk = kPadKey;
      int ni = kPadId;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s * 32 < n) {
          if (key[s] == wk && id[s] == wi) { key[s] = kPadKey; id[s] = kPadId; }
          if (kbetter(key[s], id[s], nk, ni)) { nk = key[s]; ni = id[s]; }
        }
      }
      bk = nk;
      bi = ni;
    }
  }
  return out;
}

// Reduce a warp buffer of n candidates to its k best, stored at its front, sorted. Rare.
__device__ __noinline__ Selected flush_buffer(unsigned* keys, int* ids, int* count, int n, int k,
                                             int lane) {
  __syncwarp();
  const Selected sel = warp_select<kBuf / 32>(keys, ids, n, k, lane);
  __syncwarp();
  if (lane < k) {
    keys[lane] = sel.key;
    ids[lane] = sel.id;
  }
  if (lane == 0) *count = k;
  __syncwarp();
  return sel;
}

// Online log-sum-exp state: sum of exp(x - m) over the elements seen.
struct Lse {
  float m = -INFINITY;
  float s = 0.f;

  __device__ __forceinline__ void merge(float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == -INFINITY) return;
    s = s * exp2f((m - nm) * kLog2e) + os * exp2f((om - nm) * kLog2e);
    m = nm;
  }

  __device__ __forceinline__ void warp_reduce() {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      merge(__shfl_xor_sync(kFullMask, m, off), __shfl_xor_sync(kFullMask, s, off));
    }
  }
};

// One warp's selection state. All methods are called by the whole warp, in warp-uniform control.
struct WarpTop {
  unsigned* keys;  // this warp's buffer in shared memory
  int* ids;
  unsigned* block_thr;  // shared: a key that the block holds k entries at or above
  int* shared_count;  // shared: entries in the buffer
  int count;  // its warp-uniform copy
  int k;
  int lane;
  int flush_at;
  unsigned own_key;  // this warp's k-th best at its last flush (pad until it has k)
  int own_id;
  float thr;  // float form of max(own, block) for the one-compare test
  Lse lse;

  __device__ __forceinline__ void refresh() {
    const unsigned shared_key = *reinterpret_cast<volatile unsigned*>(block_thr);
    thr = from_key(max(max(own_key, shared_key), kNegInfKey));
  }

  __device__ __forceinline__ void flush() {
    const Selected sel = flush_buffer(keys, ids, shared_count, count, k, lane);
    count = k;
    own_key = sel.kth_key;
    own_id = sel.kth_id;
    if (lane == 0 && own_id != kPadId) atomicMax(block_thr, own_key);
  }

  // x[0..N) are the logits with ids id0..id0+N-1 (`valid` false: this lane has none).
  template <int N>
  __device__ __forceinline__ void consume(const float* x, bool valid, int id0) {
    float vmax = -INFINITY;
    if (valid) {
      vmax = x[0];
#pragma unroll
      for (int j = 1; j < N; ++j) vmax = fmaxf(vmax, x[j]);
      if (vmax > lse.m) {
        lse.s *= fast_exp2((lse.m - vmax) * kLog2e);
        lse.m = vmax;
      }
      if (vmax > -INFINITY) {
        const float mb = lse.m * kLog2e;
#pragma unroll
        for (int j = 0; j < N; ++j) lse.s += fast_exp2(fmaf(x[j], kLog2e, -mb));
      }
    }
    const bool any = valid && vmax >= thr;
    if (!__any_sync(kFullMask, any)) return;
    candidates<N>(x, any, id0);
  }

  template <int N>
  __device__ __forceinline__ void candidates(const float* x, bool any, int id0) {
    if (count >= flush_at) flush();  // room for this step: count <= 47 + 32 * N <= kBuf
    const unsigned shared_key = *reinterpret_cast<volatile unsigned*>(block_thr);
    if (any) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const unsigned kx = to_key(x[j]);
        // Exact: an entry the warp's k-th beats, or one below a block-proven bound, is out.
        if (kx >= shared_key && kbetter(kx, id0 + j, own_key, own_id)) {
          const int pos = atomicAdd(shared_count, 1);
          keys[pos] = kx;
          ids[pos] = id0 + j;
        }
      }
    }
    __syncwarp();
    count = *reinterpret_cast<volatile int*>(shared_count);
    refresh();
  }
};

template <InKind K>
__device__ __forceinline__ void consume_scalars(const typename Storage<K>::T* base, int from,
                                                int to, int warp, int lane, WarpTop& top) {
  for (int i0 = from + warp * 32; i0 < to; i0 += kThreads) {  // warp-uniform
    const int i = i0 + lane;
    const bool valid = i < to;
    const float x = valid ? decode<K>(base[i]) : -INFINITY;
    top.consume<1>(&x, valid, i);
  }
}

template <InKind K>
// Capping registers keeps 4 blocks per SM resident: enough loads in flight.
__global__ void __launch_bounds__(kThreads, 4) topk_partial_kernel(
    const typename Storage<K>::T* __restrict__ logits, int64_t row_stride, int vocab, int splits,
    int chunk, int k, unsigned* __restrict__ ws_key, int* __restrict__ ws_id,
    float* __restrict__ ws_m, float* __restrict__ ws_s, float* __restrict__ logp,
    int64_t* __restrict__ ids) {
  using T = typename Storage<K>::T;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kUnroll = 4;
  __shared__ unsigned s_key[kWarps][kBuf];
  __shared__ int s_id[kWarps][kBuf];
  __shared__ unsigned s_top_key[kWarps * kMaxK];
  __shared__ int s_top_id[kWarps * kMaxK];
  __shared__ float s_m[kWarps], s_s[kWarps];
  __shared__ unsigned s_thr;
  __shared__ int s_count[kWarps];

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  if (tid == 0) s_thr = kPadKey;
  if (tid < kWarps) s_count[tid] = 0;
  __syncthreads();

  const int row = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  const int start = split * chunk;
  const int end = min(vocab, start + chunk);
  const T* base = logits + row * row_stride;

  WarpTop top;
  top.keys = s_key[warp];
  top.ids = s_id[warp];
  top.block_thr = &s_thr;
  top.shared_count = &s_count[warp];
  top.count = 0;
  top.k = k;
  top.lane = lane;
  top.flush_at = min(k + 32, kBuf - 32);
  top.own_key = kPadKey;
  top.own_id = kPadId;
  top.thr = -INFINITY;

  // Scalar head up to 16-byte alignment, then 16-byte vectors, then a scalar tail. Each warp
  // meets its elements in increasing id order (not needed for exactness, kept for clarity).
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base + start);
  const int head = min(end - start, static_cast<int>(((16u - (addr & 15u)) & 15u) / sizeof(T)));
  const int vstart = start + head;
  const int nvec = (end - vstart) / kVec;
  const int vend = vstart + nvec * kVec;
  consume_scalars<K>(base, start, vstart, warp, lane, top);

  const uint4* vp = reinterpret_cast<const uint4*>(base + vstart);
  constexpr int kTile = kUnroll * kThreads;
  if (nvec >= kTile) {
    // Seed the block bound from the first tile: the k-th largest of the warp's 32 lane maxima is
    // a value that k distinct elements reach, so anything below it is out of the top k.
    float lane_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[kVec];
      decode_vec<K>(__ldg(vp + tid + u * kThreads), x);
#pragma unroll
      for (int j = 0; j < kVec; ++j) lane_max = fmaxf(lane_max, x[j]);
    }
    unsigned key = to_key(lane_max);
    unsigned kth = kPadKey;
    for (int r = 0; r < k; ++r) {
      kth = warp_max_u32(key);
      const unsigned holders = __ballot_sync(kFullMask, key == kth);
      if (lane == __ffs(holders) - 1) key = kPadKey;
    }
    if (lane == 0) atomicMax(&s_thr, kth);
    __syncwarp();
    top.refresh();
  }
  int b0 = 0;
  for (; b0 + kTile <= nvec; b0 += kTile) {  // block-uniform
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = __ldg(vp + b0 + tid + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[kVec];
      decode_vec<K>(raw[u], x);
      top.consume<kVec>(x, true, vstart + (b0 + tid + u * kThreads) * kVec);
    }
    top.refresh();
  }
  for (int v0 = b0 + warp * 32; v0 < nvec; v0 += kThreads) {  // warp-uniform
    const int v = v0 + lane;
    const bool valid = v < nvec;
    float x[kVec];
    if (valid) {
      decode_vec<K>(__ldg(vp + v), x);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[j] = -INFINITY;
    }
    top.consume<kVec>(x, valid, vstart + v * kVec);
  }
  consume_scalars<K>(base, vend, end, warp, lane, top);

  // Block merge: each warp's k best, then warp 0 over all of them.
  const Selected mine = flush_buffer(top.keys, top.ids, top.shared_count, top.count, k, lane);
  Lse lse = top.lse;
  lse.warp_reduce();
  if (lane < k) {
    s_top_key[warp * k + lane] = mine.key;
    s_top_id[warp * k + lane] = mine.id;
  }
  if (lane == 0) {
    s_m[warp] = lse.m;
    s_s[warp] = lse.s;
  }
  __syncthreads();
  if (warp != 0) return;
  const Selected best = warp_select<kWarps * kMaxK / 32>(s_top_key, s_top_id, kWarps * k, k, lane);
  lse = Lse();
  if (lane < kWarps) {
    lse.m = s_m[lane];
    lse.s = s_s[lane];
  }
  lse.warp_reduce();
  if (splits == 1) {
    if (lane < k) {
      const float log_z = lse.m + logf(lse.s);
      logp[row * k + lane] = from_key(best.key) - log_z;
      ids[row * k + lane] = best.id;
    }
    return;
  }
  const int slot = row * splits + split;
  if (lane < k) {
    ws_key[slot * k + lane] = best.key;
    ws_id[slot * k + lane] = best.id;
  }
  if (lane == 0) {
    ws_m[slot] = lse.m;
    ws_s[slot] = lse.s;
  }
}

__global__ void __launch_bounds__(32) topk_merge_kernel(
    int splits, int k, const unsigned* __restrict__ ws_key, const int* __restrict__ ws_id,
    const float* __restrict__ ws_m, const float* __restrict__ ws_s, float* __restrict__ logp,
    int64_t* __restrict__ ids) {
  const int row = blockIdx.x;
  const int lane = threadIdx.x;
  const int n = splits * k;
  const Selected best =
      warp_select<kMaxSplits * kMaxK / 32>(ws_key + row * n, ws_id + row * n, n, k, lane);
  Lse lse;
  if (lane < splits) {
    lse.m = ws_m[row * splits + lane];
    lse.s = ws_s[row * splits + lane];
  }
  lse.warp_reduce();
  if (lane < k) {
    const float log_z = lse.m + logf(lse.s);
    logp[row * k + lane] = from_key(best.key) - log_z;
    ids[row * k + lane] = best.id;
  }
}

template <InKind K>
void launch(const at::Tensor& logits, int k, const at::Tensor& logp, const at::Tensor& ids) {
  using T = typename Storage<K>::T;
  constexpr int kVec = 16 / sizeof(T);
  const int rows = static_cast<int>(logits.size(0));
  const int vocab = static_cast<int>(logits.size(1));
  if (rows == 0) return;
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, logits.get_device()));
  // Enough blocks for ~8 per SM, but chunks of at least 8192 logits (merging costs per block).
  int splits = std::min(kMaxSplits, std::max(1, ceil_div(sms * 8, rows)));
  splits = std::min(splits, std::max(1, vocab / 8192));
  const int chunk = ceil_div(ceil_div(vocab, splits), kVec) * kVec;
  splits = ceil_div(vocab, chunk);

  auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor ws;
  unsigned* ws_key = nullptr;
  int* ws_id = nullptr;
  float* ws_m = nullptr;
  float* ws_s = nullptr;
  if (splits > 1) {
    // One allocation from torch's caching allocator (graph-capture safe): keys, ids, m, s.
    const int64_t slots = static_cast<int64_t>(rows) * splits;
    ws = at::empty({slots * (2 * k + 2)}, logits.options().dtype(at::kInt));
    ws_key = reinterpret_cast<unsigned*>(ws.data_ptr<int>());
    ws_id = ws.data_ptr<int>() + slots * k;
    ws_m = reinterpret_cast<float*>(ws.data_ptr<int>() + 2 * slots * k);
    ws_s = ws_m + slots;
  }
  const T* src = reinterpret_cast<const T*>(logits.data_ptr());
  topk_partial_kernel<K><<<rows * splits, kThreads, 0, stream>>>(
      src, logits.stride(0), vocab, splits, chunk, k, ws_key, ws_id, ws_m, ws_s,
      logp.data_ptr<float>(), ids.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {
    topk_merge_kernel<<<rows, 32, 0, stream>>>(splits, k, ws_key, ws_id, ws_m, ws_s,
                                               logp.data_ptr<float>(), ids.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace

void topk_logprobs_cuda(const at::Tensor& logits, int64_t k, const at::Tensor& logp,
                        const at::Tensor& ids) {
  check_cuda(logits, "logits");
  TORCH_CHECK(logits.dim() == 2, "ddtree: logits must be [R, V]");
  TORCH_CHECK(logits.stride(1) == 1, "ddtree: logits rows must be contiguous");
  TORCH_CHECK(logits.size(1) < INT_MAX && logits.size(0) < INT_MAX, "ddtree: logits too large");
  TORCH_CHECK(k >= 1 && k <= kMaxK && k <= logits.size(1), "ddtree: CUDA top-k needs 1 <= k <= 16 and k <= vocab, got ", k);
  check_out(logp, "logp", at::kFloat, {logits.size(0), k});
  check_out(ids, "ids", at::kLong, {logits.size(0), k});
  const c10::cuda::CUDAGuard guard(logits.device());
  switch (in_kind(logits)) {
    case InKind::F32: return launch<InKind::F32>(logits, static_cast<int>(k), logp, ids);
    case InKind::BF16: return launch<InKind::BF16>(logits, static_cast<int>(k), logp, ids);
    case InKind::F16: return launch<InKind::F16>(logits, static_cast<int>(k), logp, ids);
  }
}

}  // namespace ddtree
