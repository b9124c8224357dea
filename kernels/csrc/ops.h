// Host entry points of the DDTree CUDA ops (registered as torch.ops.ddtree.* in ops.cpp). Each
// checks its inputs, allocates its outputs and launches on the current stream.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace ddtree {

std::tuple<at::Tensor, at::Tensor> topk_logprobs_cuda(const at::Tensor& logits, int64_t k);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor>
build_tree_cuda(const at::Tensor& logp, const at::Tensor& ids, const at::Tensor& root_tokens,
                const at::Tensor& prefix_lens, int64_t budget, int64_t mask_numel);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_walk_cuda(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_tokens,
    int64_t width);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> walk_accept_cuda(
    const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target_tokens,
    const at::Tensor& prefix_lens, int64_t width);

std::tuple<at::Tensor, at::Tensor, at::Tensor> commit_indices_cuda(const at::Tensor& accept_index,
                                                                   const at::Tensor& cache_loc,
                                                                   int64_t rows);

at::Tensor path_rows_cuda(const at::Tensor& accept_index, int64_t width);

at::Tensor sample_tokens_cuda(const at::Tensor& logits, const at::Tensor& temperatures,
                              const at::Tensor& uniforms);

}  // namespace ddtree
