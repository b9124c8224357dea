"""Resolve real SGLang server arguments on CPU, for checking the DDTREE patch sets.

This is a helper module, not a test. It drives the *real* (pristine or patched) SGLang
argument parser and resolution code (`sglang.srt.server_args.prepare_server_args`) in a
child Python interpreter, each argv in its own fork of it, so no process resolves two
configurations (0.5.23 keeps runtime-context globals) while the import is paid once; the
interpreter can be any venv that has SGLang's CPU import dependencies (see
shared/docs/TESTING.md).

Pieces:

- `write_tiny_model_dirs(root, block_size)` writes a weight-less target directory (a
  2-layer Qwen3 `config.json`) and a DFlash draft directory whose config carries
  `block_size`, which SGLang reads to infer the verify width.
- `resolve_server_args(python, argv, sglang_root=None)` resolves `argv` in a child
  interpreter and returns `Resolution(ok, fields, error, log)`: `fields` maps every ServerArgs
  field to a JSON-able value (repr for anything else); `error` is the exception's message
  when resolution refused the arguments; `log` holds SGLang's log messages of the resolution.
  `sglang_root`, when given, is put first on `PYTHONPATH`, so a patched copy of the `sglang/`
  package shadows the installed one.
- `compare(python, model_dir, draft_dir, sglang_root, pristine_root)` runs the checks the
  patch sets promise and returns a list of (check, passed, detail) rows.

Command line (from `tests/`, so the stand-in's model configs import): `python -m
patching.sglang_args_probe --python VENV/bin/python --patched DIR [--pristine DIR]` prints the
rows and exits non-zero if any check failed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from standin.models import model_configs

KERNELS = str(Path(__file__).resolve().parents[2] / "kernels")

# Fields that legitimately differ between a DFLASH and a DDTREE resolution.
DDTREE_FIELDS = (
    "speculative_algorithm",
    "speculative_ddtree_budget",
    "speculative_ddtree_topk",
    "speculative_ddtree_mode",
    "speculative_ddtree_allow_hybrid_unsafe",
)
# A set that widens the tree verify moves the drafter's block to speculative_dflash_block_size
# and sets the verify width (speculative_num_draft_tokens) in tree mode; `compare` checks both,
# and RESERVATION where the release has it.
WIDTH_FIELDS = ("speculative_num_draft_tokens", "speculative_dflash_block_size")
# 0.5.13+: the per-request draft-token reservation the KV and Mamba pools are sized by, derived
# from the verify width (not a field: a cached property to 0.5.14, what 0.5.23 publishes into its
# spec bag), reported beside the fields.
RESERVATION = "max_speculative_num_draft_tokens"
# The tree budget a set takes when it keeps the verify width at the block size (16 here).
BLOCK_MAX_BUDGET = 15
# compare's rows with a pristine tree given: 3 DFLASH, 4 DDTREE, hybrid flag, defaults,
# shadow_linear, 6 refusals; a set that widens the tree verify adds 3 rows for each of budgets 31
# and its limit, one for shadow_linear's width and one refusal. Fewer would mean a check silently
# stopped running.
ROWS = 16
WIDE_ROWS = ROWS + 8

# Runs inside the child interpreter: import SGLang's parser once, then answer one argv per
# stdin line. Each argv is resolved in a fork of that interpreter, so no resolution sees
# another's state (0.5.23 keeps runtime-context globals) and the import (torch, transformers:
# most of the cost) is paid once per interpreter instead of once per resolution.
_CHILD = r"""
import json, os, sys, logging, io
class Keep(logging.Handler):  # SGLang's own log lines, returned with the resolution
    def emit(self, record):
        log_lines.append(record.getMessage())
log_lines = []
logging.getLogger("sglang").addHandler(Keep())
logging.getLogger("sglang").setLevel(logging.INFO)
logging.getLogger("sglang").propagate = False
def plain(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)
from sglang.srt.server_args import prepare_server_args
import sglang
def resolve(argv):
    real_stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        sa = prepare_server_args(argv)
    except BaseException as e:  # argparse reports on stderr and exits with SystemExit
        said, sys.stderr = sys.stderr.getvalue().strip(), real_stderr
        msg = f"{type(e).__name__}: {e}"
        if isinstance(e, SystemExit) and said:
            msg += f" ({said.splitlines()[-1]})"
        return {"ok": False, "error": msg}
    sys.stderr = real_stderr
    try:
        if hasattr(sa, "resolve_once"):  # 0.5.19+: resolution is a separate pass
            sa.resolve_once()
            values = sa.resolved_dict()
            # The reservation the spec bag publishes (0.5.23: arg_groups/overrides.py).
            from sglang.srt.arg_groups import overrides
            if hasattr(overrides, "max_speculative_num_draft_tokens"):
                values["max_speculative_num_draft_tokens"] = (
                    overrides.max_speculative_num_draft_tokens(sa)
                )
        else:  # dataclass ServerArgs resolves in __post_init__
            import dataclasses
            values = {f.name: getattr(sa, f.name) for f in dataclasses.fields(sa)}
            if hasattr(type(sa), "max_speculative_num_draft_tokens"):
                values["max_speculative_num_draft_tokens"] = sa.max_speculative_num_draft_tokens
    except BaseException as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    fields = {n: plain(v) for n, v in values.items() if not n.startswith("_")}
    fields["__sglang_file__"] = sglang.__file__
    return {"ok": True, "fields": fields, "log": log_lines}
def warm(names):
    # Resolution imports about a thousand modules lazily (model config, quantization: 3-5 s);
    # importing in this interpreter what a fork imported lets the next forks start with them.
    import importlib
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:
            pass
print("@@READY@@", flush=True)
for line in sys.stdin:
    sys.stdout.flush()
    known = set(sys.modules)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            result = resolve(json.loads(line))
        except BaseException as e:
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write("@@RESULT@@" + json.dumps(result) + "\n")
        sys.stdout.flush()
        with os.fdopen(write_end, "w") as out:
            out.write("\n".join(m for m in list(sys.modules) if m not in known))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as new_modules:
        imported = new_modules.read().split()
    _, status = os.waitpid(pid, 0)
    if status:
        print("@@RESULT@@" + json.dumps({"ok": False, "error": f"resolver exited {status}"}))
    print("@@DONE@@", flush=True)
    warm(imported)
"""


class _Resolver:
    """One child interpreter with SGLang's parser imported, for one (python, sglang_root)."""

    def __init__(self, python: str, sglang_root: str | None) -> None:
        env = dict(os.environ)
        # kernels/ (ddtree_kernels, its pure-torch reference): a set whose DDTREE server
        # arguments ddtree_kernels.sglang resolves (every set, docs/ddtree-module.md) imports it
        # there; DFLASH never does.
        env["PYTHONPATH"] = os.pathsep.join([*([str(sglang_root)] if sglang_root else []), KERNELS])
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
        # stderr to a file: a pipe nobody reads would block the child once it fills
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the child)
        self.proc = subprocess.Popen(
            [python, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True, env=env, cwd=tempfile.gettempdir(),
        )  # fmt: skip
        # A thread reads stdout into a queue, so a timeout never waits on a half-read buffer.
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # end of output: the child died

    def ask(self, argv: Sequence[str], timeout: float) -> Resolution:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(list(argv)) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._dead()
        deadline = time.monotonic() + timeout
        result: Resolution | None = None
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                return Resolution(False, {}, f"no answer within {timeout} s")
            if not line:
                return self._dead()
            if line.startswith("@@RESULT@@"):
                data = json.loads(line[len("@@RESULT@@") :])
                result = Resolution(
                    data["ok"], data.get("fields", {}), data.get("error", ""), data.get("log", [])
                )
            elif line.startswith("@@DONE@@") and result is not None:
                return result

    def _dead(self) -> Resolution:
        self.close()
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:]
        return Resolution(
            False, {}, f"child exited {self.proc.returncode} without a result: {tail}"
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# Warm children, most recently used last. Each holds SGLang imported (about 550 MB), and a
# worker meets every release's patched and pristine trees in turn: kept unbounded, sixteen
# releases' children outgrew a 24 GB machine. One compare() alternates two roots (patched and
# pristine), so three keep it warm; an older child is closed when a fourth is needed.
MAX_WARM_RESOLVERS = 3
_RESOLVERS: OrderedDict[tuple[str, str | None], _Resolver] = OrderedDict()


@atexit.register
def _close_resolvers() -> None:
    for resolver in _RESOLVERS.values():
        resolver.close()


@dataclass
class Resolution:
    ok: bool
    fields: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    log: list[str] = field(default_factory=list)  # SGLang's log messages while resolving


def write_tiny_model_dirs(root: Path, block_size: int = 16) -> tuple[Path, Path]:
    """Write a weight-less target dir and DFlash draft dir under `root`; return both."""
    for relative, text in model_configs(block_size).items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Path(root) / "target", Path(root) / "draft"


def resolve_server_args(
    python: str, argv: Sequence[str], sglang_root: str | None = None, timeout: int = 300
) -> Resolution:
    """Resolve `argv` with `prepare_server_args` in a fork of a child interpreter that has
    imported it (one child per interpreter and `sglang_root`, started on first use)."""
    key = (python, sglang_root)
    resolver = _RESOLVERS.pop(key, None)
    if resolver is None or resolver.proc.poll() is not None:
        while len(_RESOLVERS) >= MAX_WARM_RESOLVERS:
            _RESOLVERS.popitem(last=False)[1].close()
        resolver = _Resolver(python, sglang_root)
    _RESOLVERS[key] = resolver
    return resolver.ask(argv, timeout)


# Releases whose `_handle_dflash` refuses a CPU device (0.5.16: every device but CUDA; 0.5.17 and
# 0.5.18 and 0.5.19: but CUDA and NPU, and their sets refuse NPU for DDTREE; 0.5.20 on: v0523's own
# checks): their arguments resolve for CUDA, with flashinfer, the attention backend a tree needs.
CUDA_ONLY_RELEASES = frozenset({"0.5.16", "0.5.17", "0.5.18", "0.5.19"})


def release_device(release: str) -> tuple[str, tuple[str, ...]]:
    """The device and extra argv `release`'s arguments resolve with (see CUDA_ONLY_RELEASES)."""
    if release in CUDA_ONLY_RELEASES:
        return "cuda", ("--attention-backend", "flashinfer")
    return "cpu", ()


def base_argv(model_dir: Path, draft_dir: Path, device: str = "cpu") -> list[str]:
    """The arguments every resolution shares. The static memory fraction is given: left unset,
    SGLang derives it from the memory the machine reports at that moment, which moved between
    two resolutions on a loaded VM (0.569 against 0.566) and failed "exactly as before"."""
    return [
        "--model-path",
        str(model_dir),
        "--device",
        device,
        "--random-seed",
        "1234",
        "--mem-fraction-static",
        "0.8",
        "--speculative-draft-model-path",
        str(draft_dir),
    ]


def default_backend_resolutions(
    python: str, sglang_root: str, model_dir: Path, draft_dir: Path
) -> tuple[Resolution, Resolution]:
    """DDTREE tree mode on CUDA resolved with no --attention-backend (what the rendered unit
    passes: the release's default must serve) and with fa3 (no tree mask: must be refused)."""
    argv = [*base_argv(model_dir, draft_dir, "cuda"), "--speculative-algorithm", "DDTREE"]
    default = resolve_server_args(python, argv, sglang_root)
    fa3 = resolve_server_args(python, [*argv, "--attention-backend", "fa3"], sglang_root)
    return default, fa3


def _diff(a: dict, b: dict, ignore: Sequence[str] = ()) -> dict:
    keys = (set(a) | set(b)) - set(ignore) - {"__sglang_file__"}
    return {k: (a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)}


def compare(
    python: str,
    model_dir: Path,
    draft_dir: Path,
    sglang_root: str | None,
    pristine_root: str | None = None,
    device: str = "cpu",
    tree_max_budget: int = BLOCK_MAX_BUDGET,
    extra_argv: Sequence[str] = (),
) -> list[tuple[str, bool, str]]:
    """Run the patch-set promises against real argument resolution.

    `tree_max_budget` is the largest tree budget the set takes: BLOCK_MAX_BUDGET keeps the verify
    width at the block size; a larger one adds the rows of a set that widens the tree verify.
    `extra_argv` goes into every resolution (0.5.23 serves DDTREE on CUDA only, and its tree mode
    only on an attention backend that takes a tree mask).
    """
    rows: list[tuple[str, bool, str]] = []
    wide = tree_max_budget > BLOCK_MAX_BUDGET
    base = [*base_argv(model_dir, draft_dir, device), *extra_argv]
    dflash_argv = [*base, "--speculative-algorithm", "DFLASH"]

    dflash = resolve_server_args(python, dflash_argv, sglang_root)
    rows.append(("patched DFLASH resolves", dflash.ok, dflash.error))
    untouched = {k: dflash.fields.get(k) for k in DDTREE_FIELDS[1:]}
    rows.append(
        (
            "DFLASH leaves the DDTREE fields at their defaults",
            dflash.ok
            and untouched
            == {
                "speculative_ddtree_budget": None,
                "speculative_ddtree_topk": None,
                "speculative_ddtree_mode": "tree",
                "speculative_ddtree_allow_hybrid_unsafe": False,
            },
            json.dumps(untouched),
        )
    )
    if pristine_root is not None:
        before = resolve_server_args(python, dflash_argv, pristine_root)
        diff = _diff(before.fields, dflash.fields, ignore=DDTREE_FIELDS[1:])
        rows.append(
            (
                "DFLASH resolves exactly as before patching",
                before.ok and dflash.ok and not diff,
                before.error or json.dumps(diff)[:1500],
            )
        )

    ddtree = resolve_server_args(
        python,
        [
            *base,
            "--speculative-algorithm",
            "DDTREE",
            "--speculative-ddtree-budget",
            "15",
            "--speculative-ddtree-topk",
            "4",
        ],
        sglang_root,
    )
    rows.append(("DDTREE budget 15 topk 4 resolves", ddtree.ok, ddtree.error))
    if ddtree.ok and dflash.ok:
        ignore = DDTREE_FIELDS + ((*WIDTH_FIELDS, RESERVATION) if wide else ())
        diff = _diff(dflash.fields, ddtree.fields, ignore=ignore)
        rows.append(("DDTREE gets every DFLASH-derived setting", not diff, json.dumps(diff)[:1500]))
        got = {k: ddtree.fields.get(k) for k in DDTREE_FIELDS}
        want = {
            "speculative_algorithm": "DDTREE",
            "speculative_ddtree_budget": 15,
            "speculative_ddtree_topk": 4,
            "speculative_ddtree_mode": "tree",
            "speculative_ddtree_allow_hybrid_unsafe": False,
        }
        rows.append(("DDTREE settings stored", got == want, json.dumps(got)))
        width = ddtree.fields.get("speculative_num_draft_tokens")
        rows.append(
            (
                "verify width stays the block size (16)",
                width == 16 and dflash.fields.get("speculative_num_draft_tokens") == 16,
                f"DDTREE {width}, DFLASH {dflash.fields.get('speculative_num_draft_tokens')}",
            )
        )
    if wide:
        rows += _wide_tree_rows(python, base, sglang_root, dflash, tree_max_budget)

    hybrid = resolve_server_args(
        python,
        [*base, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-allow-hybrid-unsafe"],
        sglang_root,
    )
    rows.append(
        (
            "--speculative-ddtree-allow-hybrid-unsafe is stored",
            hybrid.ok and hybrid.fields.get("speculative_ddtree_allow_hybrid_unsafe") is True,
            hybrid.error,
        )
    )

    default = resolve_server_args(python, [*base, "--speculative-algorithm", "DDTREE"], sglang_root)
    rows.append(
        (
            "DDTREE defaults: budget = block_size - 1, topk = min(8, budget)",
            default.ok
            and default.fields.get("speculative_ddtree_budget") == 15
            and default.fields.get("speculative_ddtree_topk") == 8,
            default.error or json.dumps({k: default.fields.get(k) for k in DDTREE_FIELDS}),
        )
    )

    shadow = resolve_server_args(
        python,
        [*base, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-mode", "shadow_linear"],
        sglang_root,
    )
    rows.append(
        (
            "shadow_linear resolves to topk 1, budget block_size - 1",
            shadow.ok
            and shadow.fields.get("speculative_ddtree_topk") == 1
            and shadow.fields.get("speculative_ddtree_budget") == 15
            and shadow.fields.get("speculative_ddtree_mode") == "shadow_linear",
            shadow.error or json.dumps({k: shadow.fields.get(k) for k in DDTREE_FIELDS}),
        )
    )

    over = tree_max_budget + 1
    refusals = [
        (
            ["--speculative-ddtree-budget", str(over)],
            f"--speculative-ddtree-budget {over} exceeds the verify width: it must be between 1 "
            + (
                f"and {tree_max_budget} (tree mode verifies at most {over} tokens per request)"
                if wide
                else "and block_size - 1 = 15 (the DFlash block size of the draft model)"
            ),
        ),
        (["--speculative-ddtree-budget", "0"], "--speculative-ddtree-budget 0"),
        (
            ["--speculative-ddtree-budget", "6", "--speculative-ddtree-topk", "7"],
            "--speculative-ddtree-topk 7",
        ),
        (["--speculative-ddtree-topk", "0"], "--speculative-ddtree-topk 0"),
        (["--speculative-ddtree-mode", "wide"], "invalid choice"),
        (
            ["--speculative-ddtree-mode", "shadow_linear", "--speculative-ddtree-budget", "16"],
            "--speculative-ddtree-budget 16 exceeds the verify width",
        ),
    ]
    if wide:  # shadow_linear keeps the chain, so the wider tree budgets stay refused there
        refusals.append(
            (
                [
                    "--speculative-ddtree-mode", "shadow_linear",
                    "--speculative-ddtree-budget", str(tree_max_budget),
                ],
                f"--speculative-ddtree-budget {tree_max_budget} exceeds the verify width: it must "
                "be between 1 and block_size - 1 = 15 (shadow_linear verifies the DFlash block "
                "of the draft model)",
            )
        )  # fmt: skip
    for extra, sentence in refusals:
        res = resolve_server_args(
            python, [*base, "--speculative-algorithm", "DDTREE", *extra], sglang_root
        )
        rows.append(
            (
                f"refused: {' '.join(extra)}",
                (not res.ok) and sentence in res.error,
                res.error[:400] if not res.ok else "was accepted",
            )
        )
    return rows


def _wide_tree_rows(
    python: str,
    base: list[str],
    sglang_root: str | None,
    dflash: Resolution,
    tree_max_budget: int,
) -> list[tuple[str, bool, str]]:
    """Rows of a set that widens the tree verify: budgets past the block resolve to a verify
    width (and, where the release has one, a reservation) of budget + 1 with the drafter's block
    kept, and shadow_linear keeps the block width."""
    rows: list[tuple[str, bool, str]] = []
    for budget in sorted({31, tree_max_budget}):
        argv = [*base, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget",
                str(budget), "--speculative-ddtree-topk", "8"]  # fmt: skip
        res = resolve_server_args(python, argv, sglang_root)
        rows.append((f"DDTREE budget {budget} resolves", res.ok, res.error))
        want = {
            "speculative_num_draft_tokens": budget + 1,
            "speculative_dflash_block_size": 16,
            "speculative_ddtree_budget": budget,
        }
        if RESERVATION in dflash.fields:
            want[RESERVATION] = budget + 1
        got = {k: res.fields.get(k) for k in want}
        rows.append(
            (f"budget {budget}: verify width {budget + 1}, drafter block 16", got == want,
             json.dumps(got))
        )  # fmt: skip
        diff = _diff(dflash.fields, res.fields, ignore=(*DDTREE_FIELDS, *WIDTH_FIELDS, RESERVATION))
        rows.append(
            (f"budget {budget}: every other setting as DFLASH's", res.ok and not diff,
             json.dumps(diff)[:1500])
        )  # fmt: skip
    shadow = resolve_server_args(
        python,
        [*base, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-mode", "shadow_linear"],
        sglang_root,
    )
    got = {k: shadow.fields.get(k) for k in (*WIDTH_FIELDS, RESERVATION)}
    rows.append(
        (
            "shadow_linear keeps the verify width at the block size, as DFLASH",
            shadow.ok and got == {k: dflash.fields.get(k) for k in (*WIDTH_FIELDS, RESERVATION)},
            shadow.error or json.dumps(got),
        )
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="interpreter of a CPU SGLang venv")
    ap.add_argument("--patched", required=True, help="dir holding a patched sglang/ package")
    ap.add_argument("--pristine", help="dir holding the pristine sglang/ package")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--tree-max-budget", type=int, default=BLOCK_MAX_BUDGET,
        help="largest DDTREE tree budget the set takes (sglang.ddtree_max_budget)",
    )  # fmt: skip
    ap.add_argument(
        "--extra", action="append", default=[],
        help="an argument added to every resolution (repeat: --extra=--attention-backend ...)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, draft_dir = write_tiny_model_dirs(Path(tmp))
        rows = compare(
            args.python, model_dir, draft_dir, args.patched, args.pristine, args.device,
            args.tree_max_budget, args.extra,
        )  # fmt: skip
    failed = 0
    for name, ok, detail in rows:
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"\n      {detail}" if detail else ""))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
