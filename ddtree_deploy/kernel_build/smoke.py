"""The smoke test run on the host: every ddtree_kernels op, installed path against reference.

It runs through the SGLang venv's Python (optionally with a staged install first on PYTHONPATH),
so it proves what SGLang will import. `cuda`: the extension must be built and loaded, every op
must take the CUDA path on the host's GPU and match the torch reference on the CPU (exact for
ids, parents, masks and indices; 1e-5 relative for log-probs). `reference`: the build must be
reference-only and every op must run on CPU through the reference path. Given the API version the
host's patch set calls, the installed `ddtree_kernels.sglang` must provide exactly that one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Runs on the host as `python -c SMOKE_SCRIPT cuda|reference API|-`; prints one JSON line last.
SMOKE_SCRIPT = r"""
import json, sys, traceback
expect = sys.argv[1]
out = {"expect": expect, "checks": [], "failures": []}
try:
    import torch
    import ddtree_kernels
    from ddtree_kernels import ops, reference
    out["file"] = ddtree_kernels.__file__
    out["build_info"] = {k: v for k, v in ddtree_kernels.build_info().items()}
    if sys.argv[2] != "-":  # the API the host's SGLang patch set calls
        try:
            from ddtree_kernels import sglang as module
            out["module_api"] = module.API_VERSION
        except ImportError:
            out["module_api"] = None
        if str(out["module_api"]) != sys.argv[2]:
            out["failures"].append(
                f"its ddtree_kernels.sglang provides API {out['module_api'] or 'none'}, but the "
                f"SGLang patch set calls API {sys.argv[2]}; build the kernels from the checkout "
                "that holds this patch set")
    dev = "cuda" if expect == "cuda" else "cpu"
    if expect == "cuda":
        ops.require_cuda()
    elif out["build_info"]["cuda_extension_built"]:
        out["failures"].append("a reference-only build was expected but the extension is built")
    want_backend = ops.Backend.CUDA if expect == "cuda" else ops.Backend.REFERENCE
    gen = torch.Generator().manual_seed(0)

    def same(op, got, want, close=()):
        for field, a, b in zip(type(want)._fields, got, want):
            a, b = a.cpu(), b.cpu()
            ok = a.dtype == b.dtype and (torch.allclose(a, b, rtol=1e-5, atol=2e-5)
                                         if field in close else torch.equal(a, b))
            if not ok:
                out["failures"].append(f"{op}.{field} differs from the reference")
        out["checks"].append(op)

    logits = torch.randn(6, 1000, generator=gen) * 3
    x = logits.to(dev)
    if ops.backend_for(x) is not want_backend:
        out["failures"].append(f"ops take the {ops.backend_for(x).value} path on {dev}")
    same("topk_logprobs", ops.topk_logprobs(x, 4), reference.topk_logprobs(logits, 4), ("logp",))
    same("topk_logprobs[B, L, V]", ops.topk_logprobs(x.view(2, 3, 1000), 4),
         reference.topk_logprobs(logits.view(2, 3, 1000), 4), ("logp",))
    draft = torch.log_softmax(torch.randn(3, 5, 6, generator=gen) * 2, -1).topk(4, dim=-1)
    roots = torch.tensor([1, 2, 3])
    prefix = torch.tensor([0, 7, 19])
    args = (draft.values, draft.indices, roots, prefix, 12, int(prefix.sum()))
    tree = ops.build_tree(*(a.to(dev) if torch.is_tensor(a) else a for a in args))
    want_tree = reference.build_tree(*args)
    same("build_tree", tree, want_tree)
    bound = (*args[:5], args[5] + 8)  # worker v2's mask: an upper bound of the sum, a True tail
    same("build_tree[mask from a bound]",
         ops.build_tree(*(a.to(dev) if torch.is_tensor(a) else a for a in bound)),
         reference.build_tree(*bound))
    target = torch.randint(0, 6, (3, 13), generator=gen)
    walk = ops.verify_walk(tree.tokens, tree.parents, target.to(dev), 5)
    want_walk = reference.verify_walk(want_tree.tokens, want_tree.parents, target, 5)
    same("verify_walk", walk, want_walk)
    lens = torch.tensor([3, 0, 11], dtype=torch.int32)  # int32, as some releases' seq_lens
    same("walk_accept", ops.walk_accept(tree.tokens, tree.parents, target.to(dev), 5, lens.to(dev)),
         reference.walk_accept(want_tree.tokens, want_tree.parents, target, 5, lens))
    same_rows = torch.equal(ops.path_rows(walk.accept_index, 13).cpu(),
                            reference.path_rows(want_walk.accept_index, 13))
    if not same_rows:
        out["failures"].append("path_rows differs from the reference")
    out["checks"].append("path_rows")
    cache_loc = torch.randperm(3 * 13, generator=gen).view(3, 13)
    rows = 3 * 13 + 5  # the verify rows with trailing alignment padding
    same("commit_indices", ops.commit_indices(walk.accept_index, cache_loc.to(dev), rows),
         reference.commit_indices(want_walk.accept_index, cache_loc, rows))
    temps, uniforms = torch.zeros(6), torch.rand(6, generator=gen)
    got = ops.sample_tokens(x, temps.to(dev), uniforms.to(dev))
    if not torch.equal(got.cpu(), reference.sample_tokens(logits, temps, uniforms)):
        out["failures"].append("sample_tokens differs from the reference")
    out["checks"].append("sample_tokens")
    if dev == "cuda":
        torch.cuda.synchronize()
except Exception as err:
    out["failures"].append(f"{type(err).__name__}: {err}")
    out["traceback"] = traceback.format_exc()
print(json.dumps(out))
sys.exit(1 if out["failures"] else 0)
"""


@dataclass(frozen=True)
class SmokeReport:
    """What the smoke test saw: the path it expected, the ops it checked, what failed."""

    variant: str  # cuda | reference
    module_file: str
    checks: tuple[str, ...]
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def summary(self) -> str:
        if self.passed:
            return f"{len(self.checks)} ops match the reference ({self.variant} path)"
        return f"{self.variant} smoke test failed: {self.failures[0]}"


def parse_smoke_output(variant: str, stdout: str) -> SmokeReport | None:
    """The report in the script's last JSON line, or None when it printed none (it crashed)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            return SmokeReport(
                variant,
                str(data.get("file", "")),
                tuple(data.get("checks", ())),
                tuple(data.get("failures", ())),
            )
    return None
