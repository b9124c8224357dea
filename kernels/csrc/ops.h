// Host entry points of the DDTree CUDA ops (registered as torch.ops.ddtree.* in ops.cpp).
#pragma once

#include <ATen/ATen.h>

namespace ddtree {

void topk_logprobs_cuda(const at::Tensor& logits, int64_t k, const at::Tensor& logp,
                        const at::Tensor& ids);

void build_tree_cuda(const at::Tensor& logp, const at::Tensor& ids, const at::Tensor& root_tokens,
                     const at::Tensor& prefix_lens, int64_t budget, const at::Tensor& tokens,
                     const at::Tensor& parents, const at::Tensor& depths,
                     const at::Tensor& positions, const at::Tensor& ancestor_mask,
                     const at::Tensor& next_token, const at::Tensor& next_sibling,
                     const at::Tensor& retrieve_index, const at::Tensor& num_nodes,
                     const at::Tensor& custom_mask);

void verify_walk_cuda(const at::Tensor& tokens, const at::Tensor& parents,
                      const at::Tensor& target_tokens, const at::Tensor& accept_index,
                      const at::Tensor& accept_len, const at::Tensor& accept_tokens,
                      const at::Tensor& bonus);

void commit_indices_cuda(const at::Tensor& accept_index, const at::Tensor& cache_loc,
                         const at::Tensor& src, const at::Tensor& dst,
                         const at::Tensor& hidden_rows);

void sample_tokens_cuda(const at::Tensor& logits, const at::Tensor& temperatures,
                        const at::Tensor& uniforms, const at::Tensor& out);

}  // namespace ddtree
