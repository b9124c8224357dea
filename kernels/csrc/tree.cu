// Best-first DDTree build, one thread block per request, plus the flat custom-mask writer.
//
// Warp 0 runs the best-first search. The frontier (at most budget + 1 entries) lives in registers,
// S slots per lane; each pop is a warp arg-max over (score, key), where the 64-bit key packs the
// rank path most-significant-first with the depth in the low bits, so comparing keys as integers
// is the lexicographic rank-tuple tie-break. The popped entry's slot takes its next sibling and
// its first child goes into a fresh slot. Then the whole block writes the padded per-node outputs
// and the ancestor mask from a per-node ancestor table in shared memory. A second kernel, spread
// over (request, row group), writes SGLang's flat [N, prefix_len + N] custom mask.
#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

constexpr int kTreeThreads = 256;
constexpr int kMaskRowsPerBlock = 4;
constexpr uint64_t kEmptyKey = ~0ull;

// Frontier entry metadata packed in 32 bits: parent (10), prev sibling + 1 (10), rank (5), depth (6).
__device__ __forceinline__ uint32_t pack_meta(int parent, int prev, int rank, int depth) {
  return static_cast<uint32_t>(parent) | (static_cast<uint32_t>(prev + 1) << 10) |
         (static_cast<uint32_t>(rank) << 20) | (static_cast<uint32_t>(depth) << 25);
}

// Float -> int with the same order (-0.0 folded into +0.0 first, as float == treats them).
__device__ __forceinline__ int orderable(float f) {
  const int i = __float_as_int(f + 0.0f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}

__device__ __forceinline__ bool entry_better(float s, uint64_t key, float t, uint64_t kt) {
  return s > t || (s == t && key < kt);
}

struct TreeArgs {
  const float* logp;
  const int64_t* ids;
  const int64_t* root_tokens;
  const int64_t* prefix_lens;
  int max_depth, k, budget, rank_bits;
  int64_t *tokens, *parents, *depths, *positions, *next_token, *next_sibling, *retrieve_index;
  int64_t* num_nodes;
  bool* ancestor_mask;
};

template <int S>
__global__ void __launch_bounds__(kTreeThreads) build_tree_kernel(TreeArgs a) {
  extern __shared__ unsigned char smem[];
  const int b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31;
  const int L = a.max_depth, K = a.k, n = a.budget + 1;
  float* s_lp = reinterpret_cast<float*>(smem);                  // [L*K]
  float* s_score = s_lp + L * K;                                  // [n]
  int* s_parent = reinterpret_cast<int*>(s_score + n);            // [n]
  int* s_depth = s_parent + n;                                    // [n]
  int* s_rank = s_depth + n;                                      // [n]
  int* s_next_tok = s_rank + n;                                   // [n]
  int* s_next_sib = s_next_tok + n;                               // [n]
  int16_t* s_anc = reinterpret_cast<int16_t*>(s_next_sib + n);   // [n * (L + 1)]
  __shared__ int s_count;

  for (int i = tid; i < L * K; i += kTreeThreads) s_lp[i] = a.logp[b * L * K + i];
  for (int i = tid; i < n; i += kTreeThreads) {
    s_parent[i] = -1;
    s_depth[i] = 0;
    s_rank[i] = 0;
    s_next_tok[i] = -1;
    s_next_sib[i] = -1;
  }
  if (tid == 0) s_score[0] = 0.f;
  __syncthreads();

  if (tid < 32) {
    float f_score[S];
    uint64_t f_key[S];
    uint32_t f_meta[S];
#pragma unroll
    for (int j = 0; j < S; ++j) { f_score[j] = -INFINITY; f_key[j] = kEmptyKey; f_meta[j] = 0; }
    if (lane == 0) { f_score[0] = s_lp[0]; f_key[0] = 1; f_meta[0] = pack_meta(0, -1, 0, 1); }
    int used = 1;  // frontier slots handed out so far (slot c lives in lane c % 32, register c / 32)
    int pops = 0;
    for (; pops < a.budget; ++pops) {
      float bs = -INFINITY;
      uint64_t bk = kEmptyKey;
      uint32_t bm = 0;
      int bj = -1;
#pragma unroll
      for (int j = 0; j < S; ++j) {
        if (f_key[j] != kEmptyKey && (bj < 0 || entry_better(f_score[j], f_key[j], bs, bk))) {
          bs = f_score[j]; bk = f_key[j]; bm = f_meta[j]; bj = j;
        }
      }
      // Warp arg-max: hardware max over the scores as order-preserving ints, then (rarely, on
      // equal scores) min over the keys' halves among the tied lanes.
      const int my_o = bj < 0 ? INT_MIN : orderable(bs);
      const int best_o = __reduce_max_sync(kFullMask, my_o);
      if (best_o == INT_MIN) break;  // frontier empty: fewer possible nodes than the budget
      unsigned cand = __ballot_sync(kFullMask, my_o == best_o);
      if (__popc(cand) > 1) {  // every lane must reach each reduction: no short-circuit
        const bool in = (cand >> lane) & 1u;
        const unsigned hi = in ? static_cast<unsigned>(bk >> 32) : UINT_MAX;
        const unsigned min_hi = __reduce_min_sync(kFullMask, hi);
        cand = __ballot_sync(kFullMask, in && hi == min_hi);
        if (__popc(cand) > 1) {
          const bool in2 = (cand >> lane) & 1u;
          const unsigned lo = in2 ? static_cast<unsigned>(bk) : UINT_MAX;
          const unsigned min_lo = __reduce_min_sync(kFullMask, lo);
          cand = __ballot_sync(kFullMask, in2 && lo == min_lo);
        }
      }
      const int owner = __ffs(cand) - 1;
      const bool mine = lane == owner;
      const float ws = __shfl_sync(kFullMask, bs, owner);
      const uint64_t wk = __shfl_sync(kFullMask, bk, owner);
      const uint32_t meta = __shfl_sync(kFullMask, bm, owner);
      const int parent = meta & 1023, prev = static_cast<int>((meta >> 10) & 1023) - 1;
      const int rank = (meta >> 20) & 31, depth = meta >> 25;
      const int node = pops + 1;
      if (lane == 0) {
        s_score[node] = ws;
        s_parent[node] = parent;
        s_depth[node] = depth;
        s_rank[node] = rank;
        if (prev >= 0) s_next_sib[prev] = node; else s_next_tok[parent] = node;
      }
      if (mine) {  // the next sibling replaces the popped entry
        const bool has_sib = rank + 1 < K;
        const float sib_score = has_sib ? s_score[parent] + s_lp[(depth - 1) * K + rank + 1] : -INFINITY;
        const uint64_t sib_key = wk + (1ull << (64 - depth * a.rank_bits));
#pragma unroll
        for (int j = 0; j < S; ++j) {
          if (j == bj) {
            f_score[j] = sib_score;
            f_key[j] = has_sib ? sib_key : kEmptyKey;
            f_meta[j] = pack_meta(parent, node, rank + 1, depth);
          }
        }
      }
      if (depth < L) {  // the first child goes into a fresh slot
        const int c = used++;
        if (lane == (c & 31)) {
#pragma unroll
          for (int j = 0; j < S; ++j) {
            if (j == (c >> 5)) {
              f_score[j] = ws + s_lp[depth * K];
              f_key[j] = wk + 1;
              f_meta[j] = pack_meta(node, -1, 0, depth + 1);
            }
          }
        }
      }
      __syncwarp();
    }
    if (lane == 0) s_count = pops + 1;
  }
  __syncthreads();

  const int count = s_count;
  const int64_t prefix = a.prefix_lens[b];
  const int64_t out0 = static_cast<int64_t>(b) * n;
  for (int i = tid; i < n; i += kTreeThreads) {
    const bool real = i < count;
    const int d = s_depth[i];
    int64_t token = 0;
    if (i == 0) token = a.root_tokens[b];
    else if (real) token = a.ids[(static_cast<int64_t>(b) * L + d - 1) * K + s_rank[i]];
    a.tokens[out0 + i] = token;
    a.parents[out0 + i] = s_parent[i];
    a.depths[out0 + i] = d;
    a.positions[out0 + i] = prefix + d;
    a.next_token[out0 + i] = s_next_tok[i];
    a.next_sibling[out0 + i] = s_next_sib[i];
    a.retrieve_index[out0 + i] = real ? out0 + i : -1;
    int node = i;  // ancestor table: s_anc[i][d'] = ancestor of i at depth d'
    for (int dd = d; dd >= 0; --dd) {
      s_anc[i * (L + 1) + dd] = static_cast<int16_t>(node);
      node = s_parent[node];
    }
  }
  if (tid == 0) a.num_nodes[b] = count;
  __syncthreads();

  bool* mask = a.ancestor_mask + static_cast<int64_t>(b) * n * n;
  for (int idx = tid; idx < n * n; idx += kTreeThreads) {
    const int i = idx / n, j = idx - i * n;
    const int dj = s_depth[j];
    mask[idx] = i == j || (i < count && j < count && dj < s_depth[i] && s_anc[i * (L + 1) + dj] == j);
  }
}

// Fill n bytes at p with 1 (true), using 16-byte stores where aligned; threads [tid, nthreads).
__device__ __forceinline__ void fill_true(unsigned char* p, int64_t n, int tid, int nthreads) {
  const int64_t head = std::min<int64_t>(n, (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16);
  for (int64_t i = tid; i < head; i += nthreads) p[i] = 1;
  const int64_t nvec = (n - head) / 16;
  uint4* vp = reinterpret_cast<uint4*>(p + head);
  const uint4 ones = make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
  for (int64_t i = tid; i < nvec; i += nthreads) vp[i] = ones;
  for (int64_t i = head + nvec * 16 + tid; i < n; i += nthreads) p[i] = 1;
}

// Rows are placed by the device's prefix lengths, the allocation sized by the host's sum
// (`numel`). A host upper bound (overlap scheduling knows no more on the host) leaves a tail past
// the last request's rows, filled True as SGLang pads it; nothing is written at or past `numel`,
// so a host sum below the device's (or a graph replayed at longer prefixes) truncates the mask.
__global__ void custom_mask_kernel(const int64_t* __restrict__ prefix_lens,
                                   const bool* __restrict__ ancestor_mask, int n, int64_t numel,
                                   unsigned char* __restrict__ out) {
  const int b = blockIdx.x;
  __shared__ int64_t s_partial[kTreeThreads / 32];
  int64_t before = 0;  // sum of prefix_lens of earlier requests
  for (int j = threadIdx.x; j < b; j += blockDim.x) before += prefix_lens[j];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) before += __shfl_xor_sync(kFullMask, before, off);
  if ((threadIdx.x & 31) == 0) s_partial[threadIdx.x >> 5] = before;
  __syncthreads();
  before = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) before += s_partial[w];

  const int64_t prefix = prefix_lens[b];
  const int64_t width = prefix + n;
  const int64_t base = static_cast<int64_t>(n) * before + static_cast<int64_t>(b) * n * n;
  const int64_t end = base + n * width;  // past this request's rows
  if (b == static_cast<int>(gridDim.x) - 1 && blockIdx.y == 0 && end < numel) {
    fill_true(out + end, numel - end, threadIdx.x, blockDim.x);
  }
  const int row0 = blockIdx.y * kMaskRowsPerBlock;
  for (int r = row0; r < min(n, row0 + kMaskRowsPerBlock); ++r) {
    const int64_t start = base + r * width;
    if (start >= numel) break;
    const int64_t room = numel - start;
    unsigned char* row = out + start;
    fill_true(row, prefix < room ? prefix : room, threadIdx.x, blockDim.x);
    const bool* src = ancestor_mask + (static_cast<int64_t>(b) * n + r) * n;
    for (int j = threadIdx.x; j < n && prefix + j < room; j += blockDim.x) row[prefix + j] = src[j];
  }
}

template <int S>
void launch_tree(const TreeArgs& args, int batch, size_t smem, cudaStream_t stream) {
  if (smem > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(build_tree_kernel<S>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  build_tree_kernel<S><<<batch, kTreeThreads, smem, stream>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int bits_for(int64_t v) {  // bits needed to store 0..v
  int bits = 0;
  while ((int64_t{1} << bits) <= v) ++bits;
  return bits;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor>
build_tree_cuda(const at::Tensor& logp, const at::Tensor& ids, const at::Tensor& root_tokens,
                const at::Tensor& prefix_lens, int64_t budget, int64_t mask_numel) {
  check_cuda(logp, "logp");
  TORCH_CHECK(logp.dim() == 3 && logp.scalar_type() == at::kFloat && logp.is_contiguous(),
              "ddtree: logp must be contiguous float32 [B, L, K]");
  check_tensor(ids, "ids", at::kLong, logp.sizes(), logp.device());
  const int64_t batch = logp.size(0), L = logp.size(1), K = logp.size(2), n = budget + 1;
  TORCH_CHECK(budget >= 1 && budget <= 511, "ddtree: CUDA tree build needs 1 <= budget <= 511, got ", budget);
  TORCH_CHECK(K >= 1 && K <= 16, "ddtree: CUDA tree build needs 1 <= K <= 16, got ", K);
  TORCH_CHECK(L >= 1 && L <= 32, "ddtree: CUDA tree build needs 1 <= L <= 32, got ", L);
  const int rank_bits = std::max(1, bits_for(K - 1));
  TORCH_CHECK(L * rank_bits + bits_for(L) <= 64, "ddtree: CUDA tree build cannot key L=", L,
              " ranks of K=", K, " in 64 bits (K = 16 allows L <= 15)");
  check_tensor(root_tokens, "root_tokens", at::kLong, {batch}, logp.device());
  check_tensor(prefix_lens, "prefix_lens", at::kLong, {batch}, logp.device());
  TORCH_CHECK(mask_numel >= 0, "ddtree: mask_numel must be >= 0, got ", mask_numel);
  const c10::cuda::CUDAGuard guard(logp.device());
  // One allocation per output, as the schema's fresh outputs promise (C++ allocations through
  // the caching allocator: no Python dispatch, so no host cost to share one).
  const auto index = logp.options().dtype(at::kLong);
  const at::Tensor tokens = at::empty({batch, n}, index), parents = at::empty({batch, n}, index),
                   depths = at::empty({batch, n}, index), positions = at::empty({batch, n}, index),
                   next_token = at::empty({batch, n}, index),
                   next_sibling = at::empty({batch, n}, index),
                   retrieve_index = at::empty({batch, n}, index);
  const at::Tensor ancestor_mask = at::empty({batch, n, n}, logp.options().dtype(at::kBool));
  const at::Tensor num_nodes = at::empty({batch}, index);
  // Sized by the caller from the host-known sum of prefix_lens (0: no flat mask wanted).
  const at::Tensor custom_mask = at::empty({mask_numel}, logp.options().dtype(at::kBool));
  const auto outputs = std::make_tuple(tokens, parents, depths, positions, ancestor_mask,
                                       next_token, next_sibling, retrieve_index, num_nodes,
                                       custom_mask);
  if (batch == 0) return outputs;
  auto stream = c10::cuda::getCurrentCUDAStream();

  TreeArgs args{logp.data_ptr<float>(), ids.data_ptr<int64_t>(), root_tokens.data_ptr<int64_t>(),
                prefix_lens.data_ptr<int64_t>(), static_cast<int>(L), static_cast<int>(K),
                static_cast<int>(budget), rank_bits, tokens.data_ptr<int64_t>(),
                parents.data_ptr<int64_t>(), depths.data_ptr<int64_t>(),
                positions.data_ptr<int64_t>(), next_token.data_ptr<int64_t>(),
                next_sibling.data_ptr<int64_t>(), retrieve_index.data_ptr<int64_t>(),
                num_nodes.data_ptr<int64_t>(), ancestor_mask.data_ptr<bool>()};
  const size_t smem = L * K * sizeof(float) + n * sizeof(float) + 5 * n * sizeof(int) +
                      n * (L + 1) * sizeof(int16_t);
  const int slots = ceil_div(n, 32);
  if (slots <= 1) launch_tree<1>(args, batch, smem, stream);
  else if (slots <= 2) launch_tree<2>(args, batch, smem, stream);
  else if (slots <= 4) launch_tree<4>(args, batch, smem, stream);
  else if (slots <= 8) launch_tree<8>(args, batch, smem, stream);
  else launch_tree<16>(args, batch, smem, stream);

  if (mask_numel > 0) {
    const dim3 grid(static_cast<unsigned>(batch), ceil_div(n, kMaskRowsPerBlock));
    custom_mask_kernel<<<grid, kTreeThreads, 0, stream>>>(
        prefix_lens.data_ptr<int64_t>(), ancestor_mask.data_ptr<bool>(), static_cast<int>(n),
        mask_numel, reinterpret_cast<unsigned char*>(custom_mask.data_ptr<bool>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return outputs;
}

}  // namespace ddtree
