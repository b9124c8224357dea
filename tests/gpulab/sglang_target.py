"""SGLang's own model class for the lab's dense Qwen3.5 hybrid target, built and loaded on CPU.

Run by a staging venv's Python (0.5.11 or 0.5.14), never imported by pytest:

    python sglang_target.py WORK_DIR

It writes a small target of the realistic hybrid's layout (`models.qwen3_5_config` at small
widths: same architecture, config layout and checkpoint names) with `models.write_target`, then
has SGLang read it as a server does and prints one JSON line of what it found:

- the config: `ModelConfig` (SGLang's config registry: `Qwen3_5Config` with its own
  `Qwen3_5TextConfig`), the layer pattern, multimodal or not, the class `get_model_architecture`
  resolves, and the model runner's own `hybrid_gdn_config` / `mambaish_config` properties (what
  picks the hybrid attention backend and Mamba pools, and what the patch sets read as "hybrid");
- the weights: `get_model` with the default loader on the safetensors the lab wrote. The class's
  `load_weights` is wrapped to fill every parameter with NaN first and to record the names it is
  given, what it returns and what it logs; afterwards every parameter outside the vision tower
  must hold numbers, the element counts must match, and nothing may be logged as not found;
- DFlash's capture: `set_dflash_layers_to_capture` on the loaded model, and which decoder layers
  it marks;
- the processor the tokenizer manager builds for a multimodal model (`get_processor`,
  `get_mm_processor`), and what its tokenizer makes of text;
- the Mamba state per request SGLang sizes for the realistic config (float32 SSM state and conv
  window), to compare with `models.mamba_bytes_per_request`.

Runs for real on CPU (`SGLANG_USE_CPU_ENGINE=1`, float32, a gloo TP group of one). Two stand-ins:
SGLang's CPU path of the gated delta-net reads `linear_num_{key,value}_heads_cpu`, which SGLang
sets only when it pads heads for an uneven TP split: they are set to the plain counts (TP 1);
and its gated norm asks `torch.get_device_module()` for the current device, which on this
CUDA-built torch without a driver is CUDA's: while the model is built, a call without a device
answers for the CPU.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # read at import time (utils.is_cpu)

import sglang
import torch
from safetensors import safe_open
from sglang.srt.configs.device_config import DeviceConfig
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.qwen3_5 import Qwen3_5Config
from sglang.srt.configs.qwen3_next import Qwen3NextConfig
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.dp_attention import initialize_dp_attention
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_loader import get_model
from sglang.srt.model_loader.utils import get_model_architecture
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.utils.hf_transformers_utils import get_processor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpulab import models

# The realistic hybrid's layout at small widths: every fourth layer attends, two value heads per
# key head, four query heads per KV head, gated attention of head_dim 2x the linear heads'.
SMALL = models.qwen3_5_config(
    hidden=128, layers=8, heads=8, kv_heads=2, head_dim=64, intermediate=384,
    linear_key_heads=2, linear_value_heads=4, linear_head_dim=32,
)  # fmt: skip
VISION = "visual."  # SGLang's vision tower's parameters (not in a text-only checkpoint)
RUNNER_PROPERTIES = (
    "hybrid_gdn_config", "mambaish_config", "mamba2_config", "kimi_linear_config",
    "hybrid_lightning_config", "_get_linear_attn_registry_result",
)  # fmt: skip


class Recorder(logging.Handler):
    """Keeps what SGLang's model module logs while loading (a skipped name is a warning)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def start_sglang(target: Path) -> tuple[ServerArgs, ModelConfig]:
    """SGLang's process-wide state for one CPU rank, as the model runner sets it up: server args,
    a gloo TP group of one, data-parallel attention (off); and the target's ModelConfig."""
    args = ServerArgs(
        model_path=str(target),
        device="cpu",
        dtype="float32",
        skip_tokenizer_init=True,
        disable_radix_cache=True,  # what the product renders for a hybrid target
        attention_backend="torch_native",
    )
    set_global_server_args_for_scheduler(args)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    init_distributed_environment(
        backend="gloo", world_size=1, rank=0, local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )  # fmt: skip
    initialize_model_parallel(tensor_model_parallel_size=1)
    model_config = ModelConfig(str(target), dtype="float32")
    initialize_dp_attention(server_args=args, model_config=model_config)
    return args, model_config


def runner_view(model_config: ModelConfig) -> Any:
    """The model runner's config properties, bound to a stand-in holding what they read."""
    view = type("RunnerView", (), {n: getattr(ModelRunner, n) for n in RUNNER_PROPERTIES})()
    view.model_config = model_config
    view.is_draft_worker = False
    return view


def load(target: Path, model_config: ModelConfig) -> tuple[torch.nn.Module, dict[str, Any]]:
    """`get_model` with the class's load_weights wrapped (module docstring)."""
    model_class, _ = get_model_architecture(model_config)
    original = model_class.load_weights
    seen: dict[str, Any] = {}

    def recording_load_weights(self: torch.nn.Module, weights: Any) -> Any:
        for param in self.parameters():
            param.data.fill_(math.nan)
        names: list[str] = []

        def tee() -> Any:
            for name, tensor in weights:
                names.append(name)
                yield name, tensor

        loaded = original(self, tee())
        seen.update(names=names, returned=sorted(loaded))
        return loaded

    recorder = Recorder()
    logging.getLogger(model_class.__module__).addHandler(recorder)
    device_module = torch.get_device_module
    model_class.load_weights = recording_load_weights
    torch.get_device_module = lambda device=None: device_module(device or "cpu")  # see above
    try:
        model = get_model(
            model_config=model_config, load_config=LoadConfig(), device_config=DeviceConfig("cpu")
        )
    finally:
        model_class.load_weights = original
        torch.get_device_module = device_module
    seen["warnings"] = recorder.lines
    return model.eval(), seen


def weights_report(model: torch.nn.Module, seen: dict[str, Any], target: Path) -> dict[str, Any]:
    """What was loaded against what the lab wrote."""
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        checkpoint = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    params = dict(model.named_parameters())
    text = {n: p for n, p in params.items() if not n.startswith(VISION)}
    head = checkpoint["lm_head.weight"].float()
    return {
        "checkpoint_names": sorted(checkpoint),
        "names_given": sorted(seen["names"]),
        "returned": seen["returned"],
        "text_params": sorted(text),
        "unloaded": sorted(n for n, p in text.items() if torch.isnan(p).any()),
        "checkpoint_numel": sum(t.numel() for t in checkpoint.values()),
        "text_numel": sum(p.numel() for p in text.values()),
        "vision_numel": sum(p.numel() for n, p in params.items() if n.startswith(VISION)),
        "warnings": seen["warnings"],
        "lm_head_equal": bool(torch.equal(params["lm_head.weight"][: head.shape[0]], head)),
    }


def capture_report(model: Any) -> dict[str, Any]:
    """Which decoder layers DFlash's capture marks for the small target's context layers."""
    context = models.context_layers(SMALL["text_config"]["num_hidden_layers"], 3)
    model.set_dflash_layers_to_capture(context)
    layers = model.model.layers
    marked = [i for i, layer in enumerate(layers) if getattr(layer, "_is_layer_to_capture", False)]
    return {"context_layers": context, "marked_layers": marked,
            "capture_aux": bool(model.capture_aux_hidden_states)}  # fmt: skip


def processor_report(target: Path, args: ServerArgs, model_config: ModelConfig) -> dict[str, Any]:
    """The processors a tokenizer manager builds for this (multimodal) target."""
    from sglang.srt.managers.multimodal_processor import get_mm_processor, import_processors

    processor = get_processor(str(target), tokenizer_mode="auto", trust_remote_code=False,
                              use_fast=True)  # fmt: skip
    import_processors("sglang.srt.multimodal.processors")
    mm = get_mm_processor(model_config.hf_config, args, processor, "default",
                          model_config=model_config)  # fmt: skip
    return {
        "processor": type(processor).__name__,
        "mm_processor": type(mm).__name__,
        "ids": processor.tokenizer("Merge the Intervals")["input_ids"],
    }


def realistic_mamba_per_request() -> int:
    """The Mamba state per request SGLang sizes for the realistic target (its shapes, TP 1)."""
    text = Qwen3_5Config(**models.TARGETS["realistic"]["hybrid"]).text_config
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=text.linear_value_head_dim * text.linear_num_value_heads,
        n_groups=text.linear_num_key_heads, num_heads=text.linear_num_value_heads,
        head_dim=text.linear_value_head_dim, state_size=text.linear_key_head_dim,
        conv_kernel=text.linear_conv_kernel_dim,
    )  # fmt: skip
    return int(Mamba2CacheParams(shape=shape, layers=text.linear_layer_ids).mamba_cache_per_req)


def main(work: Path) -> None:
    target = work / "target"
    models.write_target(target, SMALL, on_gpu=False)
    args, model_config = start_sglang(target)
    text = model_config.hf_config.get_text_config()
    for name in ("linear_num_key_heads", "linear_num_value_heads"):
        setattr(text, f"{name}_cpu", getattr(text, name))  # the module docstring's stand-in
    runner = runner_view(model_config)
    model, seen = load(target, model_config)
    attention = model.model.layers[SMALL["text_config"]["full_attention_interval"] - 1]
    report = {
        "sglang": sglang.__version__,
        "small": SMALL,
        "config": type(model_config.hf_config).__name__,
        "text_config": f"{type(text).__module__}.{type(text).__name__}",
        "text_is_qwen3_next": isinstance(text, Qwen3NextConfig),
        "layers_block_type": list(text.layers_block_type),
        "is_multimodal": bool(model_config.is_multimodal),
        "model_class": f"{type(model).__module__}.{type(model).__name__}",
        "hybrid_gdn_config": type(runner.hybrid_gdn_config).__name__,
        "mambaish_config": type(runner.mambaish_config).__name__,
        "mlp": sorted({type(layer.mlp).__name__ for layer in model.model.layers}),
        "attn_output_gate": bool(attention.attn_output_gate),
        "rotary": [float(attention.rotary_emb.base), int(attention.rotary_emb.rotary_dim)],
        "weights": weights_report(model, seen, target),
        "capture": capture_report(model),
        "processors": processor_report(target, args, model_config),
        "realistic_mamba_per_request": realistic_mamba_per_request(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
