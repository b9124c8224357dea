// Verify walk (one warp per request, tree staged in shared memory) and commit indices.
//
// The walk follows, from the root, the child whose token equals the target's token at the current
// node; the warp checks all nodes in parallel at each step (lowest matching index wins), so a step
// costs a few shared-memory reads instead of a chain of dependent global loads.
#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

__global__ void verify_walk_kernel(const int64_t* __restrict__ tokens,
                                   const int64_t* __restrict__ parents,
                                   const int64_t* __restrict__ target_tokens, int n, int width,
                                   int64_t* __restrict__ accept_index,
                                   int64_t* __restrict__ accept_len,
                                   int64_t* __restrict__ accept_tokens,
                                   int64_t* __restrict__ bonus) {
  extern __shared__ unsigned char smem[];
  int64_t* s_tok = reinterpret_cast<int64_t*>(smem);
  int64_t* s_target = s_tok + n;
  int* s_parent = reinterpret_cast<int*>(s_target + n);
  int* s_path = s_parent + n;  // [width]
  const int b = blockIdx.x, lane = threadIdx.x;
  const int64_t row = static_cast<int64_t>(b) * n;
  for (int i = lane; i < n; i += 32) {
    s_tok[i] = tokens[row + i];
    s_target[i] = target_tokens[row + i];
    s_parent[i] = static_cast<int>(parents[row + i]);
  }
  __syncwarp();
  int cur = 0, len = 1;
  if (lane == 0) s_path[0] = 0;
  for (; len < width; ++len) {
    const int64_t want = s_target[cur];
    int found = INT_MAX;
    for (int j = lane; j < n; j += 32) {
      if (s_parent[j] == cur && s_tok[j] == want) found = min(found, j);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) found = min(found, __shfl_xor_sync(kFullMask, found, off));
    if (found == INT_MAX) break;
    cur = found;
    if (lane == 0) s_path[len] = cur;
  }
  __syncwarp();
  const int64_t out = static_cast<int64_t>(b) * width;
  for (int j = lane; j < width; j += 32) {
    const bool ok = j < len;
    accept_index[out + j] = ok ? s_path[j] : -1;
    accept_tokens[out + j] = ok ? s_target[s_path[j]] : -1;
  }
  if (lane == 0) {
    accept_len[b] = len;
    bonus[b] = s_target[cur];
  }
}

__global__ void commit_indices_kernel(const int64_t* __restrict__ accept_index,
                                      const int64_t* __restrict__ cache_loc, int n, int width,
                                      int64_t total, int64_t* __restrict__ src,
                                      int64_t* __restrict__ dst, int64_t* __restrict__ hidden_rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t b = idx / width, j = idx - b * width;
  const int64_t node = accept_index[idx];
  const bool ok = node >= 0;
  src[idx] = ok ? cache_loc[b * n + node] : -1;
  dst[idx] = ok ? cache_loc[b * n + j] : -1;
  hidden_rows[idx] = ok ? b * n + node : -1;
}

}  // namespace

void verify_walk_cuda(const at::Tensor& tokens, const at::Tensor& parents,
                      const at::Tensor& target_tokens, const at::Tensor& accept_index,
                      const at::Tensor& accept_len, const at::Tensor& accept_tokens,
                      const at::Tensor& bonus) {
  check_cuda(tokens, "tokens");
  TORCH_CHECK(tokens.dim() == 2, "ddtree: tokens must be [B, N]");
  const int64_t batch = tokens.size(0), n = tokens.size(1);
  check_out(tokens, "tokens", at::kLong, {batch, n});
  check_out(parents, "parents", at::kLong, {batch, n});
  check_out(target_tokens, "target_tokens", at::kLong, {batch, n});
  TORCH_CHECK(accept_index.dim() == 2 && accept_index.size(1) >= 1, "ddtree: accept_index must be [B, A]");
  const int64_t width = accept_index.size(1);
  check_out(accept_index, "accept_index", at::kLong, {batch, width});
  check_out(accept_tokens, "accept_tokens", at::kLong, {batch, width});
  check_out(accept_len, "accept_len", at::kLong, {batch});
  check_out(bonus, "bonus", at::kLong, {batch});
  if (batch == 0) return;
  const c10::cuda::CUDAGuard guard(tokens.device());
  const size_t smem = n * 2 * sizeof(int64_t) + (n + width) * sizeof(int);
  TORCH_CHECK(smem <= 48 * 1024, "ddtree: tree too large for the CUDA walk (N=", n, ")");
  verify_walk_kernel<<<batch, 32, smem, c10::cuda::getCurrentCUDAStream()>>>(
      tokens.data_ptr<int64_t>(), parents.data_ptr<int64_t>(), target_tokens.data_ptr<int64_t>(),
      static_cast<int>(n), static_cast<int>(width), accept_index.data_ptr<int64_t>(),
      accept_len.data_ptr<int64_t>(), accept_tokens.data_ptr<int64_t>(), bonus.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void commit_indices_cuda(const at::Tensor& accept_index, const at::Tensor& cache_loc,
                         const at::Tensor& src, const at::Tensor& dst,
                         const at::Tensor& hidden_rows) {
  check_cuda(accept_index, "accept_index");
  TORCH_CHECK(accept_index.dim() == 2 && cache_loc.dim() == 2 &&
                  cache_loc.size(0) == accept_index.size(0),
              "ddtree: accept_index must be [B, A] and cache_loc [B, N]");
  const int64_t batch = accept_index.size(0), width = accept_index.size(1), n = cache_loc.size(1);
  check_out(accept_index, "accept_index", at::kLong, {batch, width});
  check_out(cache_loc, "cache_loc", at::kLong, {batch, n});
  for (const auto* t : {&src, &dst, &hidden_rows}) check_out(*t, "commit output", at::kLong, {batch, width});
  const int64_t total = batch * width;
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(accept_index.device());
  constexpr int kThreads = 128;
  commit_indices_kernel<<<ceil_div(total, kThreads), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      accept_index.data_ptr<int64_t>(), cache_loc.data_ptr<int64_t>(), static_cast<int>(n),
      static_cast<int>(width), total, src.data_ptr<int64_t>(), dst.data_ptr<int64_t>(),
      hidden_rows.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace ddtree
