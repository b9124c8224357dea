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

// One thread per KV move (b, j) and per verify row r: the move of the j-th accepted node (the
// root's slot onto itself on padding), and the row that row r takes (its own past the path).
__global__ void commit_indices_kernel(const int64_t* __restrict__ accept_index,
                                      const int64_t* __restrict__ cache_loc, int64_t batch, int n,
                                      int width, int64_t rows, int64_t* __restrict__ kv_target,
                                      int64_t* __restrict__ kv_source,
                                      int64_t* __restrict__ row_order) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < batch * width) {
    const int64_t b = idx / width, j = idx - b * width;
    const int64_t node = accept_index[idx];
    const int64_t root = cache_loc[b * n];
    kv_target[idx] = node >= 0 ? cache_loc[b * n + j] : root;
    kv_source[idx] = node >= 0 ? cache_loc[b * n + node] : root;
  }
  if (idx < rows) {
    int64_t row = idx;
    if (idx < batch * n) {
      const int64_t b = idx / n, j = idx - b * n;
      const int64_t node = j < width ? accept_index[b * width + j] : -1;
      if (node >= 0) row = b * n + node;
    }
    row_order[idx] = row;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_walk_cuda(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_tokens,
    int64_t width) {
  check_cuda(tokens, "tokens");
  TORCH_CHECK(tokens.dim() == 2, "ddtree: tokens must be [B, N]");
  const int64_t batch = tokens.size(0), n = tokens.size(1);
  check_tensor(tokens, "tokens", at::kLong, {batch, n});
  check_tensor(parents, "parents", at::kLong, {batch, n});
  check_tensor(target_tokens, "target_tokens", at::kLong, {batch, n});
  TORCH_CHECK(width >= 1, "ddtree: the walk's width (max depth + 1) must be >= 1, got ", width);
  const c10::cuda::CUDAGuard guard(tokens.device());
  // [B, A] rows and [B] values, two allocations: accept_index and accept_tokens, then
  // accept_len and bonus.
  const std::vector<at::Tensor> paths = at::empty({2, batch, width}, tokens.options()).unbind(0);
  const std::vector<at::Tensor> ends = at::empty({2, batch}, tokens.options()).unbind(0);
  const at::Tensor &accept_index = paths[0], &accept_tokens = paths[1];
  const at::Tensor &accept_len = ends[0], &bonus = ends[1];
  const auto outputs = std::make_tuple(accept_index, accept_len, accept_tokens, bonus);
  if (batch == 0) return outputs;
  const size_t smem = n * 2 * sizeof(int64_t) + (n + width) * sizeof(int);
  TORCH_CHECK(smem <= 48 * 1024, "ddtree: tree too large for the CUDA walk (N=", n, ")");
  verify_walk_kernel<<<batch, 32, smem, c10::cuda::getCurrentCUDAStream()>>>(
      tokens.data_ptr<int64_t>(), parents.data_ptr<int64_t>(), target_tokens.data_ptr<int64_t>(),
      static_cast<int>(n), static_cast<int>(width), accept_index.data_ptr<int64_t>(),
      accept_len.data_ptr<int64_t>(), accept_tokens.data_ptr<int64_t>(), bonus.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return outputs;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> commit_indices_cuda(const at::Tensor& accept_index,
                                                                   const at::Tensor& cache_loc,
                                                                   int64_t rows) {
  check_cuda(accept_index, "accept_index");
  TORCH_CHECK(accept_index.dim() == 2 && cache_loc.dim() == 2 &&
                  cache_loc.size(0) == accept_index.size(0) &&
                  accept_index.size(1) <= cache_loc.size(1),
              "ddtree: accept_index must be [B, A] and cache_loc [B, N] with A <= N");
  const int64_t batch = accept_index.size(0), width = accept_index.size(1), n = cache_loc.size(1);
  check_tensor(accept_index, "accept_index", at::kLong, {batch, width});
  check_tensor(cache_loc, "cache_loc", at::kLong, {batch, n});
  TORCH_CHECK(rows == 0 || rows >= batch * n, "ddtree: rows must be 0 or at least B * N = ",
              batch * n, ", got ", rows);
  const c10::cuda::CUDAGuard guard(accept_index.device());
  const std::vector<at::Tensor> moves = at::empty({2, batch * width}, accept_index.options()).unbind(0);
  const at::Tensor row_order = at::empty({rows}, accept_index.options());
  const int64_t threads = std::max(batch * width, rows);
  if (threads == 0) return {moves[0], moves[1], row_order};
  constexpr int kThreads = 128;
  commit_indices_kernel<<<ceil_div(threads, kThreads), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      accept_index.data_ptr<int64_t>(), cache_loc.data_ptr<int64_t>(), batch, static_cast<int>(n),
      static_cast<int>(width), rows, moves[0].data_ptr<int64_t>(), moves[1].data_ptr<int64_t>(),
      row_order.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {moves[0], moves[1], row_order};
}

}  // namespace ddtree
