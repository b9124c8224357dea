"""Stand-in SGLang HTTP server: the real (patched) argument parser, SGLang's JSON shapes, a toy model.

TEST DOUBLE. A real SGLang server needs GPUs and gigabytes of kernels, so tests of the health
and validation gates run this instead, as the systemd unit's `python -m standin` (the unit's
`service.launch_module`). What is real: the command line is resolved by
`sglang.srt.server_args.prepare_server_args` from the SGLang install on `sys.path` (patched with
`patches/sglang/<release>/` by the test fixture), so an ExecStart real SGLang would refuse fails
here too; the endpoints and their JSON fields follow SGLang 0.5.11's `http_server.py` and
`tokenizer_manager.py`. What is a toy: the model (see `standin.model`).

Faults, read from the environment before SGLang's parser runs, so the unit's environment file
can inject them. Each applies only when the algorithm asked for is DDTREE, so the linear-DFlash
baseline and every rollback stay healthy:

- `STANDIN_START_DELAY_S`: seconds `/health` answers 503 while "loading" (any algorithm);
- `STANDIN_FAULT=crash_loop`: exit 1 right after parsing (systemd restarts it, again and again);
- `STANDIN_FAULT=slow_start`: "load" for `STANDIN_SLOW_START_S` (default 3600) seconds;
- `STANDIN_FAULT=wrong_algorithm`: `/get_server_info` reports DFLASH (a silent fallback);
- `STANDIN_FAULT=acceptance_collapse`: the draft gets no hidden states, acceptance drops to 1;
- `STANDIN_FAULT=tree_divergence`: tree mode emits a wrong token at output position 5;
- `STANDIN_FAULT=tree_near_tie_flip`: tree verify picks the target's runner-up wherever its top
  two are nearly tied (`standin.model.near_tie`): a bf16 flip, lossless within the tie rule;
- `STANDIN_FAULT=near_tie_flip`: the same in any mode, shadow_linear's chain too (what a batch's
  make-up does to bf16 rounding on a real server with several requests in flight);
- `STANDIN_FAULT=wrong_child`: the tree walk also accepts a child the target did not pick
  (`standin.planted_bug`, the bug the GPU lab plants in a real server);
- `STANDIN_FAULT=tree_slow`: a tree node costs 4 x a chain token to verify (tree slower than
  linear at every batch size);
- `STANDIN_FAULT_BUDGET=<n>`: the two tree faults above apply only when the tree's budget is n
  (one candidate of an `action=tune` sweep misbehaves, the others do not).

Timing (`standin.model.pass_time`): `STANDIN_STEP_S` (default 0.03) seconds is the fixed part of a
verify pass; the tokens verified by all requests in flight add to it (a batch shares each pass),
a tree's nodes at `STANDIN_TREE_COST` (1.05) times a chain token's cost.

Like SGLang, the server starts a child process with multiprocessing's spawn method
(`standin.helper`), so the unit's tests see what the server's children inherit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import torch

from standin.helper import start_helper
from standin.model import VOCAB, Decoder, detokenize, target_logprobs, tokenize

FAULTS = (
    "none",
    "crash_loop",
    "slow_start",
    "wrong_algorithm",
    "acceptance_collapse",
    "tree_divergence",
    "tree_near_tie_flip",
    "near_tie_flip",
    "wrong_child",
    "tree_slow",
)
_OPEN_PATHS = ("/health", "/health_generate", "/metrics")  # SGLang's API key middleware skips them

log = logging.getLogger("standin")


@dataclasses.dataclass(frozen=True)
class Knobs:
    fault: str
    start_delay_s: float
    step_s: float
    tree_cost: float
    fault_budget: int | None = None  # tree faults only for this budget; None: every tree

    @classmethod
    def from_env(cls) -> Knobs:
        fault = os.environ.get("STANDIN_FAULT", "none")
        if fault not in FAULTS:
            raise SystemExit(f"standin: STANDIN_FAULT={fault!r} is not one of {FAULTS}")
        return cls(
            fault=fault,
            start_delay_s=float(os.environ.get("STANDIN_START_DELAY_S", "0")),
            step_s=float(os.environ.get("STANDIN_STEP_S", "0.03")),
            tree_cost=float(os.environ.get("STANDIN_TREE_COST", "1.05")),
            fault_budget=int(os.environ["STANDIN_FAULT_BUDGET"])
            if os.environ.get("STANDIN_FAULT_BUDGET")
            else None,
        )


class Service:
    """The server's state: resolved arguments, the decoder, and SGLang-like counters."""

    def __init__(self, server_args: Any, knobs: Knobs) -> None:
        self.args = server_args
        self.knobs = knobs
        self.ddtree = server_args.speculative_algorithm == "DDTREE"
        self.fault = knobs.fault if self.ddtree else "none"
        delay = knobs.start_delay_s
        if self.fault == "slow_start":
            delay = max(delay, float(os.environ.get("STANDIN_SLOW_START_S", "3600")))
        self.ready_at = time.monotonic() + delay
        # The drafter's block: a set that widens the tree verify keeps it apart from the width.
        block = int(
            server_args.speculative_dflash_block_size or server_args.speculative_num_draft_tokens
        )
        tree = self.ddtree and server_args.speculative_ddtree_mode == "tree"
        budget = int(server_args.speculative_ddtree_budget) if tree else block - 1
        if self.fault in ("tree_divergence", "tree_slow") and knobs.fault_budget not in (
            None,
            budget,
        ):
            self.fault = "none"
        self.decoder = Decoder(
            block_size=block,
            topk=int(server_args.speculative_ddtree_topk) if tree else 1,
            budget=budget,
            step_s=knobs.step_s,
            tree_cost=4.0 if self.fault == "tree_slow" else knobs.tree_cost,
            collapsed=self.fault == "acceptance_collapse",
            diverge_at=5 if self.fault == "tree_divergence" and tree else None,
            flip_near_ties=(self.fault == "tree_near_tie_flip" and tree)
            or self.fault == "near_tie_flip",
            wrong_child=self.fault == "wrong_child" and tree,
        )
        # One "GPU": requests in flight share every verify pass (a batch), so each pass costs
        # more the more tokens all of them verify (`standin.model.pass_time`).
        self.lock = threading.Lock()
        self.in_flight = 0
        self.accept_lengths: list[float] = []

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def server_info(self) -> dict[str, Any]:
        import sglang  # type: ignore[import-not-found]  # the patched copy on the unit's path

        info = {f.name: _plain(getattr(self.args, f.name)) for f in dataclasses.fields(self.args)}
        if self.fault == "wrong_algorithm":
            info["speculative_algorithm"] = "DFLASH"
        recent = self.accept_lengths[-32:]
        info["internal_states"] = [
            {"avg_spec_accept_length": sum(recent) / len(recent) if recent else None}
        ]
        info["version"] = sglang.__version__
        return info

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        params = body.get("sampling_params") or {}
        ids = body.get("input_ids")
        prompt = [int(i) for i in ids] if ids else tokenize(str(body.get("text", "")))
        max_new = int(params.get("max_new_tokens", 128))
        if body.get("return_logprob"):
            if max_new != 0:  # what every release's set answers: only scoring requests pass
                raise Refused("DFLASH speculative decoding does not support return_logprob yet.")
            return _scored(prompt, int(body.get("logprob_start_len", -1)),
                           int(body.get("top_logprobs_num", 0)))  # fmt: skip
        start = time.perf_counter()
        with self.lock:
            self.in_flight += 1
        try:
            out = self.decoder.generate(prompt, max_new, lambda: self.in_flight)
        finally:
            with self.lock:
                self.in_flight -= 1
        tokens = len(out.output_ids)
        proposed = out.verify_ct * (self.decoder.block_size - 1)
        self.accept_lengths.append(tokens / out.verify_ct)
        return {
            "text": detokenize(out.output_ids),
            "output_ids": out.output_ids,
            "meta_info": {
                "id": uuid.uuid4().hex,
                "finish_reason": {"type": "length", "length": max_new},
                "prompt_tokens": len(prompt),
                "weight_version": "default",
                "completion_tokens": tokens,
                "cached_tokens": 0,
                "spec_accept_rate": out.accepted_drafts / proposed,
                "spec_accept_length": tokens / out.verify_ct,
                "spec_accepted_drafts": out.accepted_drafts,
                "spec_proposed_drafts": proposed,
                "spec_verify_ct": out.verify_ct,
                "e2e_latency": time.perf_counter() - start,
            },
        }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
        }

    def models(self) -> dict[str, Any]:
        name = self.args.served_model_name or self.args.model_path
        card = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": name,
            "max_model_len": self.args.context_length,
        }
        return {"object": "list", "data": [card]}


class Refused(Exception):
    """A request SGLang aborts with HTTP 400 and this sentence."""


def _scored(ids: list[int], start: int, top: int) -> dict[str, Any]:
    """A prompt-scoring answer (`max_new_tokens: 0`): SGLang's `input_token_logprobs` and
    `input_top_logprobs` from `start` on, the first entry without a log-prob, and the
    vocabulary's last id reported as 0, as 0.5.11 gives them."""
    start = max(0, start)

    def reported(token: int) -> int:
        return token if token < VOCAB - 1 else 0

    tokens: list[list[Any]] = [[None, reported(ids[start]), None]] if start < len(ids) else []
    tops: list[list[list[Any]] | None] = [None] if start < len(ids) else []
    for j in range(start + 1, len(ids)):
        logp = target_logprobs(ids[j - 2] if j > 1 else 0, ids[j - 1])
        tokens.append([float(logp[ids[j]]), reported(ids[j]), None])
        best = torch.topk(logp, top) if top else None
        tops.append(
            [[float(v), int(i), None] for v, i in zip(*best, strict=True)] if best else None
        )
    meta = {"id": uuid.uuid4().hex, "prompt_tokens": len(ids), "completion_tokens": 0,
            "input_token_logprobs": tokens, "output_token_logprobs": []}  # fmt: skip
    if top:
        meta |= {"input_top_logprobs": tops, "output_top_logprobs": []}
    return {"text": "", "output_ids": [], "meta_info": meta}


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


class Handler(BaseHTTPRequestHandler):
    """SGLang's routes over the stdlib HTTP server (`service` is set per server by `_handler`)."""

    protocol_version = "HTTP/1.1"
    service: ClassVar[Service]

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        service = self.service
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._authorized(path):
            self._send(401, {"error": "Unauthorized"})
        elif path in ("/health", "/health_generate"):
            self._send(200 if service.ready else 503, None)
        elif not service.ready:
            self._send(503, {"error": "server is starting"})
        elif (method, path) == ("POST", "/generate"):
            try:
                self._send(200, service.generate(json.loads(raw or b"{}")))
            except Refused as refusal:
                self._send(400, {"error": {"message": str(refusal)}})
        elif method == "GET" and path in _GET_ROUTES:
            self._send(200, getattr(service, _GET_ROUTES[path])())
        else:
            self._send(404, {"detail": "Not Found"})

    def _authorized(self, path: str) -> bool:
        key = self.service.args.api_key
        if not key or path in _OPEN_PATHS:
            return True
        return self.headers.get("Authorization") == f"Bearer {key}"

    def _send(self, status: int, body: dict[str, Any] | None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


_GET_ROUTES = {
    "/get_server_info": "server_info",
    "/server_info": "server_info",
    "/get_model_info": "model_info",
    "/model_info": "model_info",
    "/v1/models": "models",
}


def _handler(service: Service) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"service": service})


def main(argv: Sequence[str] | None = None) -> int:
    """Parse like `python -m sglang.launch_server`, then serve until killed."""
    logging.basicConfig(level=logging.INFO, format="[standin] %(message)s", stream=sys.stdout)
    knobs = Knobs.from_env()
    torch.set_num_threads(1)  # one core per pass keeps the sleep-based timing dominant
    from sglang.srt.server_args import prepare_server_args  # type: ignore[import-not-found]

    args = prepare_server_args(list(sys.argv[1:] if argv is None else argv))
    service = Service(args, knobs)
    log.info(
        "serving %s on %s:%s (algorithm %s, fault %s)",
        args.model_path,
        args.host,
        args.port,
        args.speculative_algorithm,
        service.fault,
    )
    if service.fault == "crash_loop":
        log.error("injected fault crash_loop: exiting")
        return 1
    start_helper()
    server = ThreadingHTTPServer((args.host, int(args.port)), _handler(service))
    server.daemon_threads = True
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
