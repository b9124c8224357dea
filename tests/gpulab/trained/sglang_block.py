"""SGLang's own DFlash draft block on CPU: the serving side of the train-and-serve check (issue 23).

Run by a staging venv's Python (0.5.11 or 0.5.14), never imported by pytest:

    python sglang_block.py CASE_DIR [CASE_DIR ...]

A CASE_DIR holds `draft/` (config.json, model.safetensors in SGLang's checkpoint names),
`target_head.safetensors` (`embed` [V, H], `lm_head` [V, H]) and `inputs.safetensors` (`features`
[S, K*H], the target features of context tokens at positions 0..S-1; `block_ids` [B], the anchor
then mask ids, at positions S..S+B-1). The script writes `CASE_DIR/sglang_logits.safetensors`:
`logits` [B, V] float32, `draft_tokens` [B-1] (the worker's own greedy pick for positions
1..B-1), and metadata naming the release, the worker class, the context path and the RoPE base
the draft was built with. All cases share one process: importing SGLang takes ~16 s of it.

**Runs for real** (float32, CPU, `SGLANG_USE_CPU_ENGINE=1`, which is SGLang's own CPU mode):
`ServerArgs` made global; a gloo tensor-parallel group of one (`init_distributed_environment`,
`initialize_model_parallel`); `ModelConfig(is_draft_model=True)`, which reads config.json through
transformers, and `get_model` (the DefaultModelLoader, `DFlashDraftModel.__init__` with
`parse_dflash_draft_config`, then `DFlashDraftModel.load_weights` on the safetensors); the
target's `VocabParallelEmbedding` and `ParallelLMHead`, filled by their weight loaders; the
worker's context path, `project_target_hidden` (fc, hidden_norm) then per layer `kv_proj_only`,
`apply_k_norm`, `apply_k_rope` at positions 0..S-1 and `set_kv_buffer` into a real
`MHATokenToKVPool` (0.5.11: `_append_target_hidden_sequential`, as `_append_target_hidden_to_draft_kv`
calls it, dflash_worker.py l.962-1035; 0.5.14: `_append_target_hidden_to_draft_kv_by_loc`,
dflash_worker_v2.py l.823-1000); `DFlashDraftModel.forward` (decoder layers, RadixAttention of
type ENCODER_ONLY, final norm) on the target embedding of the block ids at positions S..S+B-1;
and the worker's `_greedy_sample_from_vocab_parallel_head` on hidden positions 1..B-1.

**Replaced**, each because it cannot run on CPU, by the same semantics:
- The attention backend. The draft worker allows only flashinfer, fa3, fa4 or triton (GPU
  kernels) and runs the block in `ForwardMode.TARGET_VERIFY`, where `seq_lens` is the prefix
  length and the backend adds the block (0.5.11 dflash_worker.py l.638-655). SGLang's
  `TorchNativeAttnBackend` runs here instead; it reads `seq_lens` as the whole length, so the
  batch is `ForwardMode.EXTEND` with `seq_lens` S+B, `extend_prefix_lens` S and
  `extend_seq_lens` B. The keys are the same (S context slots, then the B block slots written by
  the forward itself) and so is the mask: the backend drops causality for ENCODER_ONLY
  (torch_native_backend.py 0.5.11 l.220, 0.5.14 l.309), as flashinfer does (0.5.11 l.848-850).
  From 0.5.14 on, RadixAttention finds the backend through a `ForwardContext`, which the model
  runner publishes; this script publishes it the same way.
- The worker object. Importing the worker module reaches the scheduler, which needs packages the
  staging venvs lack (`setproctitle`, `sgl_kernel.kvcacheio`), and the worker's constructor needs
  a GPU target. The methods named above are compiled from the wheel's own source text (the
  module's top-level imports and assignments run one by one first) and bound to a stand-in that
  holds only the attributes they read, with the fused (Triton) KV path off, as the worker falls
  back to it. `_prepare_for_speculative_decoding` / `forward_batch_generation` themselves need a
  scheduler batch, so this script does their part: block ids embedded with the target
  embedding, positions S..S+B-1, cache slots laid out as the allocator would (context 1..S,
  block S+1..S+B; slot 0 is SGLang's padding slot).
- Full logits. The worker never materialises them: it takes a chunked argmax of
  `hidden @ lm_head.weight[:vocab].T`. The script writes that product as the logits and the
  worker's argmax beside it, so the test checks that the two agree.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import os
import socket
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# SGLang reads this at import time (sglang.srt.utils.is_cpu), so it comes before the imports.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

import sglang
import torch
from safetensors.torch import load_file, save_file
from sglang.srt.configs.device_config import DeviceConfig
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_loader import get_model
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

DEVICE = "cpu"
DTYPE = torch.float32
# The worker's module: spec v2 (0.5.14 has only this one), else spec v1 (0.5.11 has only this one).
WORKER_MODULES = ("sglang.srt.speculative.dflash_worker_v2", "sglang.srt.speculative.dflash_worker")
WORKER_METHODS = (
    "_append_target_hidden_to_draft_kv_by_loc",
    "_append_target_hidden_sequential",
    "_greedy_sample_from_vocab_parallel_head",
)


def worker_methods() -> tuple[str, dict[str, Any]]:
    """The DFlash worker's methods of WORKER_METHODS that this release has, compiled from the
    wheel's own source file without importing the module (its imports reach the scheduler,
    which needs packages the staging venv does not hold, such as setproctitle).

    The module's top-level imports and assignments run one by one, and those that fail are left
    out: a method that needs one of them fails with a NameError instead of running other code.
    """
    for name in WORKER_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            break
    else:
        raise SystemExit(f"no DFlash worker module among {WORKER_MODULES}")
    source = Path(spec.origin).read_text()
    tree = ast.parse(source)
    namespace: dict[str, Any] = {"__name__": name}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign)):
            try:
                exec(compile(ast.Module([node], []), spec.origin, "exec"), namespace)
            except Exception:  # any failure: the name stays undefined (see the docstring)
                continue
    worker = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("DFlashWorker")
    )
    methods: dict[str, Any] = {}
    for node in worker.body:
        if isinstance(node, ast.FunctionDef) and node.name in WORKER_METHODS:
            text = textwrap.dedent(ast.get_source_segment(source, node) or "")
            padded = "\n" * (node.lineno - 1) + text  # tracebacks name the wheel's lines
            exec(compile(padded, spec.origin, "exec"), namespace)
            methods[node.name] = namespace[node.name]
    return f"{name}.{worker.name}", methods


def start_sglang(draft_dir: Path) -> None:
    """SGLang's process-wide state for one CPU rank: server args, a gloo TP group of one."""
    args = ServerArgs(
        model_path=str(draft_dir),
        device=DEVICE,
        dtype="float32",
        skip_tokenizer_init=True,
        attention_backend="torch_native",
    )
    set_global_server_args_for_scheduler(args)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    init_distributed_environment(
        backend="gloo",
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    initialize_model_parallel(tensor_model_parallel_size=1)


def load_draft(draft_dir: Path) -> torch.nn.Module:
    """The draft as the draft worker's model runner builds it: ModelConfig, then get_model."""
    config = ModelConfig(str(draft_dir), is_draft_model=True, dtype="float32")
    model = get_model(
        model_config=config, load_config=LoadConfig(), device_config=DeviceConfig(DEVICE)
    )
    return model.eval()


def load_target_head(path: Path) -> tuple[VocabParallelEmbedding, ParallelLMHead]:
    """The target's embedding and head as SGLang modules (vocab padded, as in a served target)."""
    tensors = load_file(str(path))
    vocab, hidden = tensors["embed"].shape
    embed = VocabParallelEmbedding(vocab, hidden, params_dtype=DTYPE)
    head = ParallelLMHead(vocab, hidden, params_dtype=DTYPE)
    for module, name in ((embed, "embed"), (head, "lm_head")):
        module.weight.weight_loader(module.weight, tensors[name].to(DTYPE))
    return embed, head


def attention_context(backend: TorchNativeAttnBackend) -> contextlib.AbstractContextManager[Any]:
    """What the model runner wraps a forward in: from 0.5.14 on, RadixAttention finds its
    backend through a published ForwardContext; 0.5.11 reads it from the ForwardBatch."""
    if importlib.util.find_spec("sglang.srt.model_executor.forward_context") is None:
        return contextlib.nullcontext()
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    return forward_context(ForwardContext(attn_backend=backend))


def stand_in_worker(model: torch.nn.Module, kv_pool: MHATokenToKVPool) -> Any:
    """An object with the wheel's worker methods and only the attributes they read."""
    worker_name, methods = worker_methods()
    worker = type("DFlashWorkerStandIn", (), {**methods, "wheel_class": worker_name})()
    worker.draft_model = model
    worker.draft_model_runner = SimpleNamespace(token_to_kv_pool=kv_pool)
    worker.model_runner = SimpleNamespace(device=torch.device(DEVICE))
    worker._use_fused_kv_materialize = False  # the fused path is a Triton kernel
    worker._fused_kv_helper = None
    worker._draft_greedy_local_cap = 0
    worker._draft_greedy_local_max_buf = None
    worker._draft_greedy_local_arg_buf = None
    return worker


def run_case(draft_dir: Path, case_dir: Path) -> None:
    """Draft one block of `case_dir` with the loaded draft and write its logits."""
    model = load_draft(draft_dir)
    embed, head = load_target_head(case_dir / "target_head.safetensors")
    inputs = load_file(str(case_dir / "inputs.safetensors"))
    features, block_ids = inputs["features"].to(DTYPE), inputs["block_ids"].to(torch.int64)
    context, block = features.shape[0], block_ids.shape[0]
    attn = model.layers[0].self_attn
    total = context + block

    req_to_token = ReqToTokenPool(1, total, DEVICE, enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        total + 1,
        page_size=1,
        dtype=DTYPE,
        head_num=attn.num_kv_heads,
        head_dim=attn.head_dim,
        layer_num=len(model.layers),
        device=DEVICE,
        enable_memory_saver=False,
    )
    slots = torch.arange(1, total + 1, dtype=torch.int64)  # slot 0 is SGLang's padding slot
    req_to_token.req_to_token[1, :total] = slots.to(torch.int32)
    worker = stand_in_worker(model, kv_pool)

    with torch.inference_mode():
        context_positions = torch.arange(context, dtype=torch.int64)
        if hasattr(worker, "_append_target_hidden_to_draft_kv_by_loc"):  # spec v2
            worker._append_target_hidden_to_draft_kv_by_loc(
                target_hidden=features, cache_loc=slots[:context], positions=context_positions
            )
        else:  # spec v1: the two calls of `_append_target_hidden_to_draft_kv`
            ctx_hidden = model.project_target_hidden(features)
            worker._append_target_hidden_sequential(ctx_hidden, context_positions, slots[:context])
        runner = SimpleNamespace(
            device=DEVICE, req_to_token_pool=req_to_token, token_to_kv_pool=kv_pool
        )
        backend = TorchNativeAttnBackend(runner)
        fields = {field.name for field in dataclasses.fields(ForwardBatch)}
        batch_fields = dict(
            forward_mode=ForwardMode.EXTEND,
            batch_size=1,
            input_ids=block_ids,
            req_pool_indices=torch.tensor([1], dtype=torch.int64),
            seq_lens=torch.tensor([total], dtype=torch.int32),
            out_cache_loc=slots[context:],
            seq_lens_sum=total,
            seq_lens_cpu=torch.tensor([total], dtype=torch.int32),
            positions=torch.arange(context, total, dtype=torch.int64),
            extend_num_tokens=block,
            extend_seq_lens=torch.tensor([block], dtype=torch.int32),
            extend_prefix_lens=torch.tensor([context], dtype=torch.int32),
            extend_seq_lens_cpu=[block],
            extend_prefix_lens_cpu=[context],
            req_to_token_pool=req_to_token,
            token_to_kv_pool=kv_pool,
            attn_backend=backend,
            input_embeds=embed(block_ids),
        )
        # 0.5.14's ForwardBatch no longer carries the pools (the backend holds them).
        batch = ForwardBatch(**{k: v for k, v in batch_fields.items() if k in fields})
        backend.init_forward_metadata(batch)
        with attention_context(backend):
            hidden = model(block_ids, batch.positions, batch, input_embeds=batch.input_embeds)
        hidden = hidden.hidden_states
        vocab = int(head.shard_indices.num_org_elements)
        logits = torch.matmul(hidden, head.weight[:vocab].T)
        tokens = worker._greedy_sample_from_vocab_parallel_head(
            hidden_states=hidden[1:], lm_head=head
        )
    context_path = (
        "_append_target_hidden_to_draft_kv_by_loc"
        if hasattr(worker, "_append_target_hidden_to_draft_kv_by_loc")
        else "project_target_hidden+_append_target_hidden_sequential"
    )
    save_file(
        {"logits": logits.float().contiguous(), "draft_tokens": tokens.contiguous()},
        str(case_dir / "sglang_logits.safetensors"),
        metadata={
            "sglang": sglang.__version__,
            "worker": worker.wheel_class,
            "context_path": context_path,
            "rope_base": str(attn.rotary_emb.base),
        },
    )


def main(argv: list[str]) -> None:
    cases = [Path(arg) for arg in argv]
    start_sglang(cases[0] / "draft")
    for case in cases:
        run_case(case / "draft", case)


if __name__ == "__main__":
    main(sys.argv[1:])
