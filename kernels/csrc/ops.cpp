// Op schemas (torch.ops.ddtree.*) and their CUDA implementations. Outputs are preallocated by the
// caller and written in place, so the ops allocate nothing but scratch and capture in CUDA graphs.
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(ddtree, m) {
  m.def("topk_logprobs(Tensor logits, int k, Tensor(a!) logp, Tensor(b!) ids) -> ()");
  m.def(
      "build_tree(Tensor logp, Tensor ids, Tensor root_tokens, Tensor prefix_lens, int budget, "
      "Tensor(a!) tokens, Tensor(b!) parents, Tensor(c!) depths, Tensor(d!) positions, "
      "Tensor(e!) ancestor_mask, Tensor(f!) next_token, Tensor(g!) next_sibling, "
      "Tensor(h!) retrieve_index, Tensor(i!) num_nodes, Tensor(j!) custom_mask) -> ()");
  m.def(
      "verify_walk(Tensor tokens, Tensor parents, Tensor target_tokens, Tensor(a!) accept_index, "
      "Tensor(b!) accept_len, Tensor(c!) accept_tokens, Tensor(d!) bonus) -> ()");
  m.def(
      "commit_indices(Tensor accept_index, Tensor cache_loc, Tensor(a!) src, Tensor(b!) dst, "
      "Tensor(c!) hidden_rows) -> ()");
  m.def("sample_tokens(Tensor logits, Tensor temperatures, Tensor uniforms, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(ddtree, CUDA, m) {
  m.impl("topk_logprobs", &ddtree::topk_logprobs_cuda);
  m.impl("build_tree", &ddtree::build_tree_cuda);
  m.impl("verify_walk", &ddtree::verify_walk_cuda);
  m.impl("commit_indices", &ddtree::commit_indices_cuda);
  m.impl("sample_tokens", &ddtree::sample_tokens_cuda);
}

// Importing ddtree_kernels._C runs the registrations above; the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
