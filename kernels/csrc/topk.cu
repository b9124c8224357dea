// Single-pass top-k + log-sum-exp over logits rows (fp32/bf16/fp16).
//
// Each row is split into `splits` chunks so that small batches still fill the GPU. A block reads
// its chunk once with 16-byte loads, keeping per thread a sorted top-KP list (KP = k rounded up
// to a power of two) and an online (max, sum of exp) pair; lists are merged warp by warp. With one
// split the block writes the final log-probs; otherwise a one-warp-per-row kernel merges the
// partial lists and sums. Order: larger logit first, ties to the smaller token id.
#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSplits = 32;

template <int KP>
struct TopList {
  float v[KP];
  int id[KP];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int j = 0; j < KP; ++j) {
      v[j] = -INFINITY;
      id[j] = INT_MAX;
    }
  }

  __device__ __forceinline__ void insert(float x, int i) {
    if (!better(x, i, v[KP - 1], id[KP - 1])) return;
    v[KP - 1] = x;
    id[KP - 1] = i;
#pragma unroll
    for (int j = KP - 1; j > 0; --j) {
      if (better(v[j], id[j], v[j - 1], id[j - 1])) {
        const float tv = v[j]; v[j] = v[j - 1]; v[j - 1] = tv;
        const int ti = id[j]; id[j] = id[j - 1]; id[j - 1] = ti;
      }
    }
  }

  // Replace each lane's list by the warp's top KP (every lane ends with the same list).
  __device__ __forceinline__ void warp_merge() {
    float ov[KP];
    int oid[KP];
#pragma unroll
    for (int r = 0; r < KP; ++r) {
      float bv = v[0];
      int bi = id[0];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float xv = __shfl_xor_sync(kFullMask, bv, off);
        const int xi = __shfl_xor_sync(kFullMask, bi, off);
        if (better(xv, xi, bv, bi)) { bv = xv; bi = xi; }
      }
      ov[r] = bv;
      oid[r] = bi;
      if (v[0] == bv && id[0] == bi) {  // this lane's head won: pop it
#pragma unroll
        for (int j = 0; j < KP - 1; ++j) { v[j] = v[j + 1]; id[j] = id[j + 1]; }
        v[KP - 1] = -INFINITY;
        id[KP - 1] = INT_MAX;
      }
    }
#pragma unroll
    for (int r = 0; r < KP; ++r) { v[r] = ov[r]; id[r] = oid[r]; }
  }
};

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

// `floor`: a value some lane already holds KP entries at or above; anything strictly below it
// cannot make the top KP. Without it every lane's own threshold rises slowly and, in SIMT, the
// warp pays the insertion whenever any lane inserts.
template <int KP, int N>
__device__ __forceinline__ void consume(const float* x, int first_id, float floor,
                                        TopList<KP>& top, Lse& lse) {
  float vmax = x[0];
#pragma unroll
  for (int j = 1; j < N; ++j) vmax = fmaxf(vmax, x[j]);
  if (vmax > lse.m) {
    lse.s *= exp2f((lse.m - vmax) * kLog2e);
    lse.m = vmax;
  }
  if (vmax > -INFINITY) {
    const float mb = lse.m * kLog2e;
#pragma unroll
    for (int j = 0; j < N; ++j) lse.s += exp2f(fmaf(x[j], kLog2e, -mb));
  }
  if (vmax >= fmaxf(top.v[KP - 1], floor)) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (x[j] >= floor) top.insert(x[j], first_id + j);
    }
  }
}

template <InKind K, int KP>
// Capping registers keeps 4 blocks (2 for k > 8) resident per SM: enough loads in flight.
__global__ void __launch_bounds__(kThreads, KP <= 8 ? 4 : 2) topk_partial_kernel(
    const typename Storage<K>::T* __restrict__ logits, int64_t row_stride, int vocab, int splits,
    int chunk, int k, float* __restrict__ ws_v, int* __restrict__ ws_id, float* __restrict__ ws_m,
    float* __restrict__ ws_s, float* __restrict__ logp, int64_t* __restrict__ ids) {
  using T = typename Storage<K>::T;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kUnroll = 4;
  const int row = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  const int start = split * chunk;
  const int end = min(vocab, start + chunk);
  const T* base = logits + row * row_stride;

  TopList<KP> top;
  top.clear();
  Lse lse;
  const int tid = threadIdx.x;
  float floor = -INFINITY;
  const bool aligned = (reinterpret_cast<uintptr_t>(base + start) % 16) == 0;
  int scalar_from = start;
  if (aligned) {
    const int nvec = (end - start) / kVec;
    const uint4* vp = reinterpret_cast<const uint4*>(base + start);
    int b0 = 0;  // block-uniform trip count, so the warp can share its threshold each round
    for (; b0 + kUnroll * kThreads <= nvec; b0 += kUnroll * kThreads) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[u] = __ldg(vp + b0 + tid + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float x[kVec];
        decode_vec<K>(raw[u], x);
        consume<KP, kVec>(x, start + (b0 + tid + u * kThreads) * kVec, floor, top, lse);
      }
      floor = top.v[KP - 1];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) floor = fmaxf(floor, __shfl_xor_sync(kFullMask, floor, off));
    }
    for (int v = b0 + tid; v < nvec; v += kThreads) {
      float x[kVec];
      decode_vec<K>(__ldg(vp + v), x);
      consume<KP, kVec>(x, start + v * kVec, floor, top, lse);
    }
    scalar_from = start + nvec * kVec;
  }
  for (int i = scalar_from + tid; i < end; i += kThreads) {
    const float x = decode<K>(base[i]);
    consume<KP, 1>(&x, i, floor, top, lse);
  }

  // Block merge: warps first, then warp 0 over the warps' lists.
  __shared__ float s_v[kWarps][KP];
  __shared__ int s_id[kWarps][KP];
  __shared__ float s_m[kWarps], s_s[kWarps];
  const int lane = tid & 31, warp = tid >> 5;
  top.warp_merge();
  lse.warp_reduce();
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < KP; ++j) { s_v[warp][j] = top.v[j]; s_id[warp][j] = top.id[j]; }
    s_m[warp] = lse.m;
    s_s[warp] = lse.s;
  }
  __syncthreads();
  if (warp != 0) return;
  if (lane < kWarps) {
#pragma unroll
    for (int j = 0; j < KP; ++j) { top.v[j] = s_v[lane][j]; top.id[j] = s_id[lane][j]; }
    lse.m = s_m[lane];
    lse.s = s_s[lane];
  } else {
    top.clear();
    lse = Lse();
  }
  top.warp_merge();
  lse.warp_reduce();
  if (lane != 0) return;
  if (splits == 1) {
    const float log_z = lse.m + logf(lse.s);
#pragma unroll
    for (int j = 0; j < KP; ++j) {
      if (j < k) {
        logp[row * k + j] = top.v[j] - log_z;
        ids[row * k + j] = top.id[j];
      }
    }
    return;
  }
  const int slot = row * splits + split;
#pragma unroll
  for (int j = 0; j < KP; ++j) { ws_v[slot * KP + j] = top.v[j]; ws_id[slot * KP + j] = top.id[j]; }
  ws_m[slot] = lse.m;
  ws_s[slot] = lse.s;
}

template <int KP>
__global__ void topk_merge_kernel(int splits, int k, const float* __restrict__ ws_v,
                                  const int* __restrict__ ws_id, const float* __restrict__ ws_m,
                                  const float* __restrict__ ws_s, float* __restrict__ logp,
                                  int64_t* __restrict__ ids) {
  const int row = blockIdx.x;
  const int lane = threadIdx.x;
  TopList<KP> top;
  Lse lse;
  if (lane < splits) {
    const int slot = row * splits + lane;
#pragma unroll
    for (int j = 0; j < KP; ++j) { top.v[j] = ws_v[slot * KP + j]; top.id[j] = ws_id[slot * KP + j]; }
    lse.m = ws_m[slot];
    lse.s = ws_s[slot];
  } else {
    top.clear();
  }
  top.warp_merge();
  lse.warp_reduce();
  if (lane != 0) return;
  const float log_z = lse.m + logf(lse.s);
#pragma unroll
  for (int j = 0; j < KP; ++j) {
    if (j < k) {
      logp[row * k + j] = top.v[j] - log_z;
      ids[row * k + j] = top.id[j];
    }
  }
}

template <InKind K, int KP>
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
  at::Tensor ws_v, ws_id, ws_m, ws_s;
  if (splits > 1) {
    auto f = logits.options().dtype(at::kFloat);
    ws_v = at::empty({rows, splits, KP}, f);
    ws_id = at::empty({rows, splits, KP}, f.dtype(at::kInt));
    ws_m = at::empty({rows, splits}, f);
    ws_s = at::empty({rows, splits}, f);
  }
  const T* src = reinterpret_cast<const T*>(logits.data_ptr());
  topk_partial_kernel<K, KP><<<rows * splits, kThreads, 0, stream>>>(
      src, logits.stride(0), vocab, splits, chunk, k,
      splits > 1 ? ws_v.data_ptr<float>() : nullptr, splits > 1 ? ws_id.data_ptr<int>() : nullptr,
      splits > 1 ? ws_m.data_ptr<float>() : nullptr, splits > 1 ? ws_s.data_ptr<float>() : nullptr,
      logp.data_ptr<float>(), ids.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {
    topk_merge_kernel<KP><<<rows, 32, 0, stream>>>(
        splits, k, ws_v.data_ptr<float>(), ws_id.data_ptr<int>(), ws_m.data_ptr<float>(),
        ws_s.data_ptr<float>(), logp.data_ptr<float>(), ids.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <InKind K>
void launch_k(const at::Tensor& logits, int k, const at::Tensor& logp, const at::Tensor& ids) {
  if (k <= 1) return launch<K, 1>(logits, k, logp, ids);
  if (k <= 2) return launch<K, 2>(logits, k, logp, ids);
  if (k <= 4) return launch<K, 4>(logits, k, logp, ids);
  if (k <= 8) return launch<K, 8>(logits, k, logp, ids);
  return launch<K, 16>(logits, k, logp, ids);
}

}  // namespace

void topk_logprobs_cuda(const at::Tensor& logits, int64_t k, const at::Tensor& logp,
                        const at::Tensor& ids) {
  check_cuda(logits, "logits");
  TORCH_CHECK(logits.dim() == 2, "ddtree: logits must be [R, V]");
  TORCH_CHECK(logits.stride(1) == 1, "ddtree: logits rows must be contiguous");
  TORCH_CHECK(logits.size(1) < INT_MAX && logits.size(0) < INT_MAX, "ddtree: logits too large");
  TORCH_CHECK(k >= 1 && k <= 16 && k <= logits.size(1), "ddtree: CUDA top-k needs 1 <= k <= 16 and k <= vocab, got ", k);
  check_out(logp, "logp", at::kFloat, {logits.size(0), k});
  check_out(ids, "ids", at::kLong, {logits.size(0), k});
  const c10::cuda::CUDAGuard guard(logits.device());
  switch (in_kind(logits)) {
    case InKind::F32: return launch_k<InKind::F32>(logits, static_cast<int>(k), logp, ids);
    case InKind::BF16: return launch_k<InKind::BF16>(logits, static_cast<int>(k), logp, ids);
    case InKind::F16: return launch_k<InKind::F16>(logits, static_cast<int>(k), logp, ids);
  }
}

}  // namespace ddtree
