// Verify walk (one warp per request, tree staged in shared memory), alone or with DFlash's accept
// outputs, commit indices and the path-first row permutation.
//
// The walk follows, from the root, the child whose token equals the target's token at the current
// node; the warp checks all nodes in parallel at each step (lowest matching index wins), so a step
// costs a few shared-memory reads instead of a chain of dependent global loads.
#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

// Where a walk's results go. verify_walk fills the walk's own outputs; walk_accept fills DFlash's
// accept outputs instead (accepted drafts, commit lengths, 0-padded tokens, new sequence lengths,
// with P the dtype of prefix_lens). A null pointer is an output the op does not return.
template <typename P>
struct WalkOut {
  int64_t* accept_index;   // [B, A]
  int64_t* bonus;          // [B]
  int64_t* accept_len;     // [B]
  int64_t* accept_tokens;  // [B, A], -1 padded
  const P* prefix_lens;    // [B]
  int32_t* drafts;         // [B]
  int32_t* commit_lens;    // [B]
  int64_t* out_tokens;     // [B, A], 0 padded
  P* new_seq_lens;         // [B]
};

template <typename P>
__global__ void verify_walk_kernel(const int64_t* __restrict__ tokens,
                                   const int64_t* __restrict__ parents,
                                   const int64_t* __restrict__ target_tokens, int n, int width,
                                   WalkOut<P> o) {
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
    const int64_t token = ok ? s_target[s_path[j]] : -1;
    o.accept_index[out + j] = ok ? s_path[j] : -1;
    if (o.accept_tokens != nullptr) o.accept_tokens[out + j] = token;
    if (o.out_tokens != nullptr) o.out_tokens[out + j] = ok ? token : 0;
  }
  if (lane == 0) {
    o.bonus[b] = s_target[cur];
    if (o.accept_len != nullptr) o.accept_len[b] = len;
    if (o.commit_lens != nullptr) {
      o.commit_lens[b] = len;
      o.drafts[b] = len - 1;
      o.new_seq_lens[b] = static_cast<P>(o.prefix_lens[b] + len);
    }
  }
}

template <typename P>
void launch_walk(const at::Tensor& tokens, const at::Tensor& parents,
                 const at::Tensor& target_tokens, int64_t width, const WalkOut<P>& o) {
  const int64_t batch = tokens.size(0), n = tokens.size(1);
  if (batch == 0) return;
  const size_t smem = n * 2 * sizeof(int64_t) + (n + width) * sizeof(int);
  TORCH_CHECK(smem <= 48 * 1024, "ddtree: tree too large for the CUDA walk (N=", n, ")");
  verify_walk_kernel<P><<<batch, 32, smem, c10::cuda::getCurrentCUDAStream()>>>(
      tokens.data_ptr<int64_t>(), parents.data_ptr<int64_t>(), target_tokens.data_ptr<int64_t>(),
      static_cast<int>(n), static_cast<int>(width), o);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The walk's inputs, as both walk ops take them.
void check_walk_inputs(const at::Tensor& tokens, const at::Tensor& parents,
                       const at::Tensor& target_tokens, int64_t width) {
  check_cuda(tokens, "tokens");
  TORCH_CHECK(tokens.dim() == 2, "ddtree: tokens must be [B, N]");
  const int64_t batch = tokens.size(0), n = tokens.size(1);
  check_tensor(tokens, "tokens", at::kLong, {batch, n}, tokens.device());
  check_tensor(parents, "parents", at::kLong, {batch, n}, tokens.device());
  check_tensor(target_tokens, "target_tokens", at::kLong, {batch, n}, tokens.device());
  TORCH_CHECK(width >= 1, "ddtree: the walk's width (max depth + 1) must be >= 1, got ", width);
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

// One thread per verify row (b, i): node i's place in request b's permutation, its position on
// the accepted path, or past the path in node order (the path's length plus the nodes below i
// that are off it). The path is packed from the root, -1 after, its nodes below `width` (as the
// walk gives it); a place another path would give past the row is not written.
__global__ void path_rows_kernel(const int64_t* __restrict__ accept_index, int64_t batch,
                                 int width, int path_width, int64_t* __restrict__ rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= batch * width) return;
  const int64_t b = idx / width;
  const int i = static_cast<int>(idx - b * width);
  const int64_t* path = accept_index + b * path_width;
  int len = 0, below = 0, at = -1;
  for (int j = 0; j < path_width; ++j) {
    const int64_t node = path[j];
    if (node < 0) continue;
    ++len;
    if (node < i) ++below;
    if (node == i) at = j;
  }
  const int place = at >= 0 ? at : len + (i - below);
  if (place < width) rows[b * width + place] = idx;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_walk_cuda(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_tokens,
    int64_t width) {
  check_walk_inputs(tokens, parents, target_tokens, width);
  const int64_t batch = tokens.size(0);
  const c10::cuda::CUDAGuard guard(tokens.device());
  const at::Tensor accept_index = at::empty({batch, width}, tokens.options()),
                   accept_tokens = at::empty({batch, width}, tokens.options()),
                   accept_len = at::empty({batch}, tokens.options()),
                   bonus = at::empty({batch}, tokens.options());
  const WalkOut<int64_t> o{accept_index.data_ptr<int64_t>(), bonus.data_ptr<int64_t>(),
                           accept_len.data_ptr<int64_t>(), accept_tokens.data_ptr<int64_t>(),
                           nullptr, nullptr, nullptr, nullptr, nullptr};
  launch_walk(tokens, parents, target_tokens, width, o);
  return {accept_index, accept_len, accept_tokens, bonus};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> walk_accept_cuda(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_tokens,
    const at::Tensor& prefix_lens, int64_t width) {
  check_walk_inputs(tokens, parents, target_tokens, width);
  const int64_t batch = tokens.size(0);
  TORCH_CHECK(prefix_lens.scalar_type() == at::kLong || prefix_lens.scalar_type() == at::kInt,
              "ddtree: prefix_lens must be int32 or int64, got ", prefix_lens.scalar_type());
  check_tensor(prefix_lens, "prefix_lens", prefix_lens.scalar_type(), {batch}, tokens.device());
  const c10::cuda::CUDAGuard guard(tokens.device());
  const auto lens = tokens.options().dtype(at::kInt);
  const at::Tensor accept_index = at::empty({batch, width}, tokens.options()),
                   out_tokens = at::empty({batch, width}, tokens.options()),
                   drafts = at::empty({batch}, lens), commit_lens = at::empty({batch}, lens);
  const at::Tensor bonus = at::empty({batch}, tokens.options());
  const at::Tensor new_seq_lens = at::empty({batch}, prefix_lens.options());
  if (prefix_lens.scalar_type() == at::kLong) {
    const WalkOut<int64_t> o{accept_index.data_ptr<int64_t>(), bonus.data_ptr<int64_t>(),
                             nullptr, nullptr, prefix_lens.data_ptr<int64_t>(),
                             drafts.data_ptr<int32_t>(), commit_lens.data_ptr<int32_t>(),
                             out_tokens.data_ptr<int64_t>(), new_seq_lens.data_ptr<int64_t>()};
    launch_walk(tokens, parents, target_tokens, width, o);
  } else {
    const WalkOut<int32_t> o{accept_index.data_ptr<int64_t>(), bonus.data_ptr<int64_t>(),
                             nullptr, nullptr, prefix_lens.data_ptr<int32_t>(),
                             drafts.data_ptr<int32_t>(), commit_lens.data_ptr<int32_t>(),
                             out_tokens.data_ptr<int64_t>(), new_seq_lens.data_ptr<int32_t>()};
    launch_walk(tokens, parents, target_tokens, width, o);
  }
  return {drafts, commit_lens, bonus, out_tokens, new_seq_lens, accept_index};
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
  check_tensor(accept_index, "accept_index", at::kLong, {batch, width}, accept_index.device());
  check_tensor(cache_loc, "cache_loc", at::kLong, {batch, n}, accept_index.device());
  TORCH_CHECK(rows == 0 || rows >= batch * n, "ddtree: rows must be 0 or at least B * N = ",
              batch * n, ", got ", rows);
  const c10::cuda::CUDAGuard guard(accept_index.device());
  const at::Tensor kv_target = at::empty({batch * width}, accept_index.options()),
                   kv_source = at::empty({batch * width}, accept_index.options()),
                   row_order = at::empty({rows}, accept_index.options());
  const int64_t threads = std::max(batch * width, rows);
  if (threads == 0) return {kv_target, kv_source, row_order};
  constexpr int kThreads = 128;
  commit_indices_kernel<<<ceil_div(threads, kThreads), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      accept_index.data_ptr<int64_t>(), cache_loc.data_ptr<int64_t>(), batch, static_cast<int>(n),
      static_cast<int>(width), rows, kv_target.data_ptr<int64_t>(), kv_source.data_ptr<int64_t>(),
      row_order.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {kv_target, kv_source, row_order};
}

at::Tensor path_rows_cuda(const at::Tensor& accept_index, int64_t width) {
  check_cuda(accept_index, "accept_index");
  TORCH_CHECK(accept_index.dim() == 2 && accept_index.size(1) <= width,
              "ddtree: accept_index must be [B, A] with A <= width (", width, ")");
  const int64_t batch = accept_index.size(0), path_width = accept_index.size(1);
  check_tensor(accept_index, "accept_index", at::kLong, {batch, path_width}, accept_index.device());
  const c10::cuda::CUDAGuard guard(accept_index.device());
  const at::Tensor rows = at::empty({batch * width}, accept_index.options());
  if (rows.numel() == 0) return rows;
  constexpr int kThreads = 128;
  path_rows_kernel<<<ceil_div(batch * width, kThreads), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      accept_index.data_ptr<int64_t>(), batch, static_cast<int>(width),
      static_cast<int>(path_width), rows.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return rows;
}

}  // namespace ddtree
