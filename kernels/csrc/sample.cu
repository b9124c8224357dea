// Target token per row: argmax at temperature <= 0, else an inverse-CDF draw from
// softmax(logits / T) at a given uniform. One block per row: pass 1 finds the max and the sum of
// exp; pass 2 scans tiles in index order (block prefix sums) until the cumulative mass passes u.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // contiguous logits per thread per pass-2 tile

struct ArgBest {
  float v;
  int id;
};

struct ArgBestOp {
  __device__ __forceinline__ ArgBest operator()(const ArgBest& a, const ArgBest& b) const {
    return better(b.v, b.id, a.v, a.id) ? b : a;
  }
};

struct IntMaxOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};

struct MaxSum {
  float m, s;
};

struct MaxSumOp {
  __device__ __forceinline__ MaxSum operator()(const MaxSum& a, const MaxSum& b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.f};
    return {m, a.s * exp2f((a.m - m) * kLog2e) + b.s * exp2f((b.m - m) * kLog2e)};
  }
};

template <InKind K>
__global__ void __launch_bounds__(kThreads) sample_kernel(
    const typename Storage<K>::T* __restrict__ logits, int64_t row_stride, int vocab,
    const float* __restrict__ temperatures, const float* __restrict__ uniforms,
    int64_t* __restrict__ out) {
  using BlockArg = cub::BlockReduce<ArgBest, kThreads>;
  using BlockMs = cub::BlockReduce<MaxSum, kThreads>;
  using BlockInt = cub::BlockReduce<int, kThreads>;
  using BlockScan = cub::BlockScan<float, kThreads>;
  __shared__ union {
    typename BlockArg::TempStorage arg;
    typename BlockInt::TempStorage i;
    typename BlockMs::TempStorage ms;
    typename BlockScan::TempStorage scan;
  } tmp;
  __shared__ float s_m, s_sum;
  __shared__ int s_last, s_pick;

  const int r = blockIdx.x, tid = threadIdx.x;
  const auto* row = logits + r * row_stride;
  const float t = temperatures[r];
  if (!(t > 0.f)) {
    ArgBest best{-INFINITY, INT_MAX};
    for (int i = tid; i < vocab; i += kThreads) {
      const float x = decode<K>(row[i]);
      if (better(x, i, best.v, best.id)) best = {x, i};
    }
    best = BlockArg(tmp.arg).Reduce(best, ArgBestOp());
    if (tid == 0) out[r] = best.id;
    return;
  }

  const float inv_t = 1.f / t;
  MaxSum ms{-INFINITY, 0.f};
  int last = 0;  // last index with a finite logit: the draw if rounding leaves u * sum uncrossed
  for (int i = tid; i < vocab; i += kThreads) {
    const float z = decode<K>(row[i]) * inv_t;
    if (z > -INFINITY) last = i;
    ms = MaxSumOp()(ms, MaxSum{z, 1.f});
  }
  ms = BlockMs(tmp.ms).Reduce(ms, MaxSumOp());
  if (tid == 0) { s_m = ms.m; s_sum = ms.s; s_pick = -1; }
  __syncthreads();
  last = BlockInt(tmp.i).Reduce(last, IntMaxOp());
  if (tid == 0) s_last = last;
  __syncthreads();

  const float mb = s_m * kLog2e;
  const float target = uniforms[r] * s_sum;
  float running = 0.f;
  for (int tile = 0; tile < vocab; tile += kThreads * kPerThread) {
    const int first = tile + tid * kPerThread;
    float e[kPerThread];
    float local = 0.f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = first + j;
      e[j] = i < vocab ? exp2f(fmaf(decode<K>(row[i]) * inv_t, kLog2e, -mb)) : 0.f;
      local += e[j];
    }
    float incl, tile_sum;
    BlockScan(tmp.scan).InclusiveSum(local, incl, tile_sum);
    const float before = running + incl - local;
    if (local > 0.f && before <= target && target < running + incl) {
      float c = before;
      int pick = -1;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        c += e[j];
        if (pick < 0 && e[j] > 0.f && (c > target || j == kPerThread - 1)) pick = first + j;
      }
      if (pick >= vocab || pick < 0) pick = min(first + kPerThread, vocab) - 1;
      s_pick = pick;
    }
    __syncthreads();
    if (s_pick >= 0) break;
    running += tile_sum;
  }
  if (tid == 0) out[r] = s_pick >= 0 ? s_pick : s_last;
}

template <InKind K>
void launch(const at::Tensor& logits, const at::Tensor& temperatures, const at::Tensor& uniforms,
            const at::Tensor& out) {
  using T = typename Storage<K>::T;
  sample_kernel<K><<<logits.size(0), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const T*>(logits.data_ptr()), logits.stride(0),
      static_cast<int>(logits.size(1)), temperatures.data_ptr<float>(),
      uniforms.data_ptr<float>(), out.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor sample_tokens_cuda(const at::Tensor& logits, const at::Tensor& temperatures,
                              const at::Tensor& uniforms) {
  check_cuda(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "ddtree: logits must be [R, V] with contiguous rows");
  const int64_t rows = logits.size(0);
  check_tensor(temperatures, "temperatures", at::kFloat, {rows}, logits.device());
  check_tensor(uniforms, "uniforms", at::kFloat, {rows}, logits.device());
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  if (rows == 0) return out;
  switch (in_kind(logits)) {
    case InKind::F32: launch<InKind::F32>(logits, temperatures, uniforms, out); break;
    case InKind::BF16: launch<InKind::BF16>(logits, temperatures, uniforms, out); break;
    case InKind::F16: launch<InKind::F16>(logits, temperatures, uniforms, out); break;
  }
  return out;
}

}  // namespace ddtree
