// Op schemas (torch.ops.ddtree.*) and their CUDA implementations. Each op allocates its outputs
// itself (on the current stream, through the caching allocator, so a step still captures in a CUDA
// graph) and returns them: one Python call per op, where an out= schema made the caller dispatch
// an allocation per output first (issue 22: a host-bound step pays each dispatch, ~10 us).
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(ddtree, m) {
  m.def("topk_logprobs(Tensor logits, int k) -> (Tensor logp, Tensor ids)");
  m.def(
      "build_tree(Tensor logp, Tensor ids, Tensor root_tokens, Tensor prefix_lens, int budget, "
      "int mask_numel) -> (Tensor tokens, Tensor parents, Tensor depths, Tensor positions, "
      "Tensor ancestor_mask, Tensor next_token, Tensor next_sibling, Tensor retrieve_index, "
      "Tensor num_nodes, Tensor custom_mask)");
  m.def(
      "verify_walk(Tensor tokens, Tensor parents, Tensor target_tokens, int width) -> "
      "(Tensor accept_index, Tensor accept_len, Tensor accept_tokens, Tensor bonus)");
  m.def(
      "walk_accept(Tensor tokens, Tensor parents, Tensor target_tokens, Tensor prefix_lens, "
      "int width) -> (Tensor accepted_drafts, Tensor commit_lens, Tensor bonus, "
      "Tensor out_tokens, Tensor new_seq_lens, Tensor accept_index)");
  m.def(
      "commit_indices(Tensor accept_index, Tensor cache_loc, int rows) -> "
      "(Tensor kv_target, Tensor kv_source, Tensor row_order)");
  m.def("path_rows(Tensor accept_index, int width) -> Tensor");
  m.def("sample_tokens(Tensor logits, Tensor temperatures, Tensor uniforms) -> Tensor");
}

TORCH_LIBRARY_IMPL(ddtree, CUDA, m) {
  m.impl("topk_logprobs", &ddtree::topk_logprobs_cuda);
  m.impl("build_tree", &ddtree::build_tree_cuda);
  m.impl("verify_walk", &ddtree::verify_walk_cuda);
  m.impl("walk_accept", &ddtree::walk_accept_cuda);
  m.impl("commit_indices", &ddtree::commit_indices_cuda);
  m.impl("path_rows", &ddtree::path_rows_cuda);
  m.impl("sample_tokens", &ddtree::sample_tokens_cuda);
}

// Importing ddtree_kernels._C runs the registrations above; the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
