"""Each reviewed set from 0.5.15 to 0.5.22 is held to `action=port` from its neighbour's set.

Those sets began as ports (0.5.14's forward to 0.5.15 through 0.5.18, 0.5.23's back to 0.5.22 and
on down to 0.5.19); since they shipped, each case ports the shipped source set, alone in a sets
root, to the real wheel of its release, so a real port keeps running and the reviewed set keeps
answering to it:
- the port fails exactly at the hunks the reviewed set rewrote, each for the reason named here;
- the gate sites it leaves unreviewed are the ones the reviewed set reviews new, every review it
  carries keeps its disposition, and the reviews it leaves behind are the sites the release lacks;
- with the rewritten patches taken from the reviewed set, every other patch ports to exactly the
  reviewed diff (names, hashes, text, gate sites), so a change to the source set that the release
  shares shows up here until the release's set carries it.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddtree_deploy.patching.manifest import load_patch_set, patch_sets_root
from ddtree_deploy.patching.port import HunkStatus, PortReport, port_patch_set
from patching.trees import series_of, shipped_sets_root, wheel_path

ENUM = "0001-spec-info-ddtree-enum.patch"
SERVER_ARGS = "0002-server-args-ddtree.patch"
WORKER = "0003-ddtree-worker.patch"
HELPERS = "0004-ddtree-verify-input.patch"  # dflash_utils: the worker's helpers live here
TREE_MASK = "0005-ddtree-tree-mask-verify.patch"  # 0.5.19 on
MAMBA_POOL = "0006-hybrid-mamba-pool-ddtree-tree.patch"  # 0.5.19 on
HYBRID_LINEAR = "0007-hybrid-linear-attn-ddtree-tree.patch"  # 0.5.14 to 0.5.18
BACKEND = "0006-server-args-ddtree-attention-backend.patch"  # 0.5.14 to 0.5.18

HunkKey = tuple[str, str, int]  # (patch, file name, hunk index)
GateKey = tuple[str, str, str]  # (file, function, line)


def _absent(line: str, kind: str = "context") -> str:
    return f"{kind} line {line!r} is not in the file"


@dataclass(frozen=True)
class Lineage:
    """The port of the shipped `source` set to `release`, whose reviewed set it must explain."""

    source: str
    release: str
    failed: dict[HunkKey, str]  # every hunk that cannot land, with the port's reason
    unreviewed: dict[str, int]  # the new gate sites the release's set reviews, by disposition
    fuzzed: tuple[HunkKey, ...] = ()  # hunks that land with fuzz, in the wrong place
    also_rewritten: tuple[str, ...] = ()  # patches whose hunks fit but whose code had to change
    hunks: int | None = None  # how many hunks the port reads, where a case pins it

    @property
    def rewritten(self) -> tuple[str, ...]:
        """The patches the release's set rewrote: every one with a failed or misplaced hunk."""
        keys = [*self.failed, *self.fuzzed]
        return tuple(sorted({patch for patch, _, _ in keys} | set(self.also_rewritten)))


_MIXIN = "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"
_PS_HOOK = "speculative_hook.py"

LINEAGES = (
    # 0.5.15's worker: the draft runner shares the target's server args, an in-graph draft sampler
    # replaced the eager greedy head, and the batch argument is `batch` (0.5.14:
    # model_worker_batch, which the log-prob guard's hunk names too). 0004 holds the worker's new
    # helper. New sites: four widened gates. Both sets are on ddtree_kernels.sglang
    # (docs/ddtree-module.md: the worker runs the module's Verifier, the server arguments
    # are resolved there, 0001 holds the module's loader), so 0004 still differs (0.5.15 keeps its
    # draft runner's args copy), the worker's import hunk (1) now reaches the spec_info import and
    # fails on 0.5.15's imports, and its verify-input hunk (11) keeps DFLASH's out_cache_loc line as
    # context (the tree's slots are set after it); the other failed hunks are the same ones. 0002
    # differs though it lands: 0.5.15 declares its default attention backend and writes it only when
    # resolution ends, so its backend check reads the resolution view.
    Lineage(
        "0.5.14",
        "0.5.15",
        failed={
            (WORKER, "dflash_worker_v2.py", 1): _absent("set_global_server_args_for_scheduler,"),
            (WORKER, "dflash_worker_v2.py", 2): _absent(
                "draft_server_args = deepcopy(server_args)"
            ),
            (WORKER, "dflash_worker_v2.py", 8): _absent("def _validate_phase1_sampling_support("),
            (WORKER, "dflash_worker_v2.py", 9): _absent("model_worker_batch: ScheduleBatch,"),
            (WORKER, "dflash_worker_v2.py", 10): _absent("if draft_hidden is None:"),
            (WORKER, "dflash_worker_v2.py", 11): _absent(
                "model_worker_batch.out_cache_loc = verify_out_cache_loc"
            ),
            (WORKER, "dflash_worker_v2.py", 13): _absent("batch=model_worker_batch,"),
        },
        unreviewed={"widened": 4},
        also_rewritten=(SERVER_ARGS, HELPERS),
    ),
    # 0.5.16: the enum, the hidden-state relay and the algorithm help gained DSPARK, whose fields
    # follow the DFLASH block size; the worker builds its draft runner through
    # build_draft_tp_worker, no longer refuses TP > 1 for its draft sampler and keeps the Mamba
    # commit in a flag set at init; SpecInput's token scaling became a function; the Mamba pools
    # moved to mem_cache/kv_cache_configurator.py; dflash_utils' sampled-verify tail, the context
    # of 0004's scoring-request helpers, changed. It asks is_dflash_family() at most runtime
    # gates, so most of its new sites are widened. Both sets are on ddtree_kernels.sglang
    # (docs/ddtree-module.md), so the patches that land port to 0.5.16's as they are (0006 too, its
    # backend check being in 0002's call in both); the worker's import hunk (1) reaches the
    # spec_info import and fails on 0.5.16's imports, its Mamba commit hunk is 15 (42 hunks in all).
    Lineage(
        "0.5.15",
        "0.5.16",
        failed={
            (ENUM, "spec_info.py", 1): "context line 'EAGLE = auto()' does not match line 38 "
            "('DSPARK = auto()') at the closest match (3 of 6 lines)",
            (ENUM, "spec_utils.py", 1): _absent(
                "# multi_layer_eagle and DFLASH don't relay hidden_states through FutureMap."
            ),
            (SERVER_ARGS, "server_args.py", 1): "removed line '\"Speculative algorithm. "
            "Builtins: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DF...' is not in the file",
            (SERVER_ARGS, "server_args.py", 2): "context line "
            "'speculative_accept_threshold_single: A[' does not match line 1753 "
            "('speculative_dspark_block_size: A[') at the closest match (3 of 6 lines)",
            (WORKER, "dflash_worker_v2.py", 1): _absent(
                "from sglang.srt.speculative.triton_ops.cache_locs import assign_extend_cache_..."
            ),
            (WORKER, "dflash_worker_v2.py", 2): _absent(
                "# Draft runner (separate KV cache + attention backend).", "removed"
            ),
            (WORKER, "dflash_worker_v2.py", 6): _absent("if get_tp_group().world_size != 1:"),
            (WORKER, "dflash_worker_v2.py", 15): _absent("if need_mamba_verify_commit:"),
            (HELPERS, "dflash_utils.py", 5): "context line 'row_ids = torch.arange(bs, "
            "dtype=torch.long, device=device)' does not match line 790 ('target_probs,') at the "
            "closest match (7 of 11 lines)",
            (HYBRID_LINEAR, "spec_info.py", 1): _absent(
                "x * c2 for x in batch.global_num_tokens_for_logprob"
            ),
            **{
                (HYBRID_LINEAR, "model_runner_kv_cache_mixin.py", i): f"{_MIXIN} is not in "
                "sglang==0.5.16"
                for i in (1, 2, 3)
            },
        },
        unreviewed={"widened": 14, "covered": 2, "dflash-only": 1},
        hunks=42,
    ),
    # 0.5.17: the server-args fields carry NS("spec") (published into its config bags); the worker
    # imports the exec bag and the grammar and simulated-acceptance helpers, and masks a grammar
    # over its chain before the accept; the Mamba pools read the top-k from the spec bag. 0004's
    # import hunk no longer fits (dflash_utils imports the environment first), and its helpers
    # needed a deep copy of the read-only server args, the draft runner's spec-bag scope and the
    # grammar refusal. New sites: string gates around the
    # ReplaySSM spec-verify and lazy Mamba caching (covered), grammar overlap, an NPU verify layout
    # and two gates 0.5.17 rewrote (widened). Both sets are on ddtree_kernels.sglang
    # (docs/ddtree-module.md): the worker's spec_info import hunk (2) fails on 0.5.17's imports, its
    # draft-tokens hunk (13, without the window's slots, now the verify step's) lands with fuzz, and
    # its accept hunk is 15.
    Lineage(
        "0.5.16",
        "0.5.17",
        failed={
            (SERVER_ARGS, "server_args.py", 1): "context line '] = None' does not match line "
            "2027 ('NS(\"spec\"),') at the closest match (4 of 7 lines)",
            (WORKER, "dflash_worker_v2.py", 1): "context line ')' does not match line 31 ('from "
            "sglang.srt.server_args import ServerArgs') at the closest match (7 of 13 lines)",
            (WORKER, "dflash_worker_v2.py", 2): _absent(
                "from sglang.srt.speculative.spec_utils import assign_req_to_token_pool_func"
            ),
            (WORKER, "dflash_worker_v2.py", 15): "context line 'candidates = draft_tokens' does "
            "not match line 1718 ('# Constrain every chain position before accept picks from "
            "it.') at the closest match (6 of 12 lines)",
            (HELPERS, "dflash_utils.py", 2): _absent(
                "from sglang.srt.utils import is_cuda, is_musa"
            ),
            **{
                (HYBRID_LINEAR, "kv_cache_configurator.py", i): _absent(
                    "speculative_eagle_topk=self.server_args.speculative_eagle_topk,", "removed"
                )
                for i in (2, 3)
            },
        },
        unreviewed={"covered": 3, "widened": 4},
        also_rewritten=(ENUM, BACKEND),
        hunks=44,
    ),
    # 0.5.18: spec_utils and the KV-cache configurator read the spec bag and runtime_context's
    # predicates, the worker imports the schedule bag, dflash_utils grew Triton kernels after
    # validate_dflash_request, and the extra_buffer_lazy assert 0002 widened is gone; DFLASH
    # serves log-prob requests, so the worker's log-prob guard and validate_dflash_request's
    # refusal, which 0003 and 0004 narrow to generating requests, are gone. (0004 also refuses
    # generating log-prob requests for DDTREE and writes the draft runner's server-args copy past
    # the read-only guard, 0.5.18 having no ServerArgs.override; 0003 refuses a tree on a head
    # without a dense weight.) New sites: the DFlash draft pool's KV cell size and the spec worker's draft runners
    # (widened), and the FutureMap relay gate spec_utils now asks of the spec bag (covered).
    # Both sets are on ddtree_kernels.sglang (docs/ddtree-module.md): the worker's import of
    # spec_info's loader is one more hunk, so the log-prob guard's is 14 (50 hunks in all: 0001
    # gains the loader's hunk, 0006 keeps one of its three); the failed hunks are the fat sets'
    # ones.
    Lineage(
        "0.5.17",
        "0.5.18",
        failed={
            (ENUM, "spec_utils.py", 1): _absent(
                'if server_args.speculative_algorithm in ("STANDALONE", "DFLASH", "DSPARK"):',
                "removed",
            ),
            (SERVER_ARGS, "server_args.py", 3): _absent(
                'algo = (view.speculative_algorithm or "").upper()'
            ),
            (WORKER, "dflash_worker_v2.py", 1): _absent(
                "from sglang.srt.runtime_context import get_exec", "removed"
            ),
            (WORKER, "dflash_worker_v2.py", 14): _absent(
                'if getattr(batch, "return_logprob", False):', "removed"
            ),
            (HELPERS, "dflash_utils.py", 2): _absent(
                "from sglang.srt.layers.sampler import apply_custom_logit_processor"
            ),
            (HELPERS, "dflash_utils.py", 6): _absent("if req.return_logprob:", "removed"),
            (HYBRID_LINEAR, "kv_cache_configurator.py", 2): _absent(
                "speculative_num_draft_tokens=self.server_args.max_speculative_num_draft_tokens,"
            ),
            (HYBRID_LINEAR, "kv_cache_configurator.py", 3): _absent(
                '_algo = (self.server_args.speculative_algorithm or "").upper()'
            ),
            (HYBRID_LINEAR, "kv_cache_configurator.py", 4): _absent(
                "enable_mamba_extra_buffer=self.server_args.enable_mamba_extra_buffer(),"
            ),
        },
        unreviewed={"covered": 1, "widened": 2},
        also_rewritten=(BACKEND,),
        hunks=50,
    ),
    # Back from 0.5.23: 0.5.22 has no spec-decode metrics tuple, no dflash_dp module and no
    # draft_parallel import; its worker keeps the draft placement in `draft_owns_attention`
    # (0.5.23: `draft_parallel_layout`), has no deferred target-verify gather (so no
    # `target_predict`) and no `target_dp_enabled`; its dflash_utils ends past the line 0.5.23's
    # helpers follow. Worker hunks that apply were rewritten too: the tree proposal's
    # draft_parallel_layout (test_verify_path_worker_v2's name check holds that) and
    # `_ddtree_accept`, which reads 0.5.23's `target_predict`. New sites: an NPU gate whose line
    # 0.5.23 wraps and DeepSeek-V4's prefill snapshot, gone by 0.5.23 (widened). Both sets are on
    # API 2's rules (issue 46: the hybrid set-up, accept, KV plan and recurrent top-k are the
    # module's), so their 0002, 0004 and 0006 differ only where the releases do; the worker's
    # failed hunks are its import (2: `from functools import partial` is one more hunk) and
    # the draft scopes 0.5.22 enters its own way.
    Lineage(
        "0.5.23",
        "0.5.22",
        failed={
            (ENUM, "metrics_reporter.py", 1): _absent("SpeculativeAlgorithm.EAGLE,"),
            (WORKER, "dflash_worker_v2.py", 2): _absent(
                "from sglang.srt.speculative.dflash_dp import gather_draft_embedding"
            ),
            (WORKER, "dflash_worker_v2.py", 5): _absent(
                "with draft_pp_context(), draft_tp_context(self.draft_parallel_layout):", "removed"
            ),
            (WORKER, "dflash_worker_v2.py", 8): _absent(
                "self._target_logits_processor = self._defer_target_verify_gather()"
            ),
            (WORKER, "dflash_worker_v2.py", 9): _absent(
                "draft_tp_context(self.draft_parallel_layout),"
            ),
            (WORKER, "dflash_worker_v2.py", 10): _absent(
                "target_dp_enabled = get_parallel().attn_dp_enabled"
            ),
            (HELPERS, "dflash_utils.py", 6): "its lines match only before the end of the "
            "previous hunk",
            (MAMBA_POOL, "kv_cache_configurator.py", 1): _absent(
                "from sglang.srt.speculative.draft_parallel import legacy_draft_attn_tp_size"
            ),
        },
        unreviewed={"widened": 2},
    ),
    # 0.5.21 enters the draft's TP scope through its own `self.draft_tp_context(group,
    # owns_attention=...)` (0.5.22: `draft_tp_context(self.draft_owns_attention)`), plans no KV
    # window (no `kv_loc_plan`) and captures no sampling mask. Both sets are on API 2's rules
    # (docs/ddtree-module.md), so only the worker is rewritten: its import of spec_info's loader
    # (4) has 0.5.22's sampling-mask import as context; the tree proposal and the verify input
    # apply but were rewritten into 0.5.21's context (its group argument; no KV plan for a wider
    # tree's window); 0.5.21's `_accept_block` also returns its target_predict, so its accept
    # (21) keeps the tree branch beside DFLASH's call instead of taking its place, and skips
    # SGLANG_SIMULATE_ACC_LEN's forced chain acceptance for DDTREE after it. New site: the
    # scheduler's DFlash request validation, whose method 0.5.22 renamed (widened).
    Lineage(
        "0.5.22",
        "0.5.21",
        failed={
            (WORKER, "dflash_worker_v2.py", 4): _absent(
                "from sglang.srt.speculative.spec_sampling_mask import ("
            ),
            (WORKER, "dflash_worker_v2.py", 5): _absent(
                "self.draft_owns_attention = get_parallel().attn_dp_enabled"
            ),
            **{
                (WORKER, "dflash_worker_v2.py", i): _absent(
                    "draft_tp_context(self.draft_owns_attention),"
                )
                for i in (9, 10)
            },
            (WORKER, "dflash_worker_v2.py", 21): "removed line ') = self._accept_block(' does "
            "not match line 2801 ('target_predict,') at the closest match (9 of 13 lines)",
        },
        unreviewed={"widened": 1},
    ),
    # 0.5.20 (the last worker that takes `ps`): its replay-SSM refusal asks kimi_linear_config()
    # (0.5.21: self.hybrid_kda_config); its draft-window warning lists ("EAGLE3", "DFLASH") and
    # its DFLASH device check names no `algorithm`; its worker enters no draft_pp_context, passes
    # the draft runner's TP group alone to `self.draft_tp_context` and has no LiLiCorr head. Hunk
    # 7 (`_init_ddtree`) applies but refused LiLiCorr drafts through `self.lilicorr`, which 0.5.20
    # never sets (test_verify_path_worker_v2's name check holds that). New sites: the draft-window
    # warning (covered), an NPU replay copy 0.5.21 splits in two, the draft runner's input-embeds
    # copy and the prefill read-done fastpath 0.5.21 moves into SpeculativeAlgorithm. Both sets are
    # on ddtree_kernels.sglang (docs/ddtree-module.md): the failed hunks are the fat sets' ones, the
    # worker's one more (its import of spec_info's loader, 3) shifting their indices; on API 2's
    # rules (issue 46) the worker's first hunk imports functools.partial for the accept's TP sync
    # beside 0.5.21's typing import, which 0.5.20 spells otherwise (1), one index more again.
    Lineage(
        "0.5.21",
        "0.5.20",
        failed={
            (ENUM, "kv_cache_configurator.py", 1): _absent("and self.hybrid_kda_config is None"),
            (SERVER_ARGS, _PS_HOOK, 1): _absent(
                'if cfg.speculative_algorithm not in ("EAGLE", "EAGLE3", "DFLASH"):', "removed"
            ),
            (SERVER_ARGS, _PS_HOOK, 2): _absent('algorithm = "DFLASH"', "removed"),
            (WORKER, "dflash_worker_v2.py", 1): _absent(
                "from typing import TYPE_CHECKING, List, Optional, Tuple"
            ),
            (WORKER, "dflash_worker_v2.py", 5): _absent(
                "with draft_pp_context(), draft_init_ctx:", "removed"
            ),
            (WORKER, "dflash_worker_v2.py", 9): _absent("self.draft_model_runner.tp_group,"),
            (WORKER, "dflash_worker_v2.py", 11): _absent("self.draft_model_runner.tp_group,"),
            (WORKER, "dflash_worker_v2.py", 17): _absent(
                "if lilicorr_q_rows is not None and not _is_all_greedy(batch.sampling_info):"
            ),
        },
        unreviewed={"covered": 1, "widened": 3},
        also_rewritten=(HELPERS, TREE_MASK),
    ),
    # 0.5.19 (the last release whose argument fields are annotated in server_args.py): no UNO
    # member to anchor DDTREE after, no arg_groups/fields/spec.py (0002 adds the fields to
    # server_args.py, as 0.5.16's set does), a DFLASH device check of CUDA or NPU on one line; its
    # worker enters no draft TP scope, has no Domino head, and its third Mamba request pool spells
    # its layer ids inline. One hunk lands with fuzz 2 in the wrong place: the tree's retrieve
    # arrays would replace the chain's after the sampling kernel ran, not before, so 0004 was
    # rewritten. 0.5.19 has no gate site 0.5.20's set does not review. Both sets are on
    # ddtree_kernels.sglang (docs/ddtree-module.md): the worker's spec_info import (hunk 3) lands,
    # so its failed hunks are the fat sets' lines two indices on (5, 7, 9, 10, 16), behind API 2's
    # functools import (1), which 0.5.19 takes beside its dataclasses import, not `import os`.
    Lineage(
        "0.5.20",
        "0.5.19",
        failed={
            (ENUM, "spec_info.py", 1): _absent("UNO = auto()"),
            **{
                (SERVER_ARGS, "spec.py", i): "sglang/srt/arg_groups/fields/spec.py is not in "
                "sglang==0.5.19"
                for i in (1, 2)
            },
            (SERVER_ARGS, _PS_HOOK, 2): _absent("if not (", "removed"),
            (WORKER, "dflash_worker_v2.py", 1): _absent("import os"),
            (WORKER, "dflash_worker_v2.py", 5): _absent(
                "draft_init_ctx = draft_tp_context(get_parallel().attn_tp_group)"
            ),
            (WORKER, "dflash_worker_v2.py", 7): _absent(
                "if self._is_domino and self.block_size <= 1:"
            ),
            **{
                (WORKER, "dflash_worker_v2.py", i): _absent(
                    "with self.draft_tp_context(self.draft_model_runner.tp_group):", "removed"
                )
                for i in (9, 10)
            },
            (WORKER, "dflash_worker_v2.py", 16): _absent("anchor_token_ids=block_ids[:, 0],"),
            (MAMBA_POOL, "kv_cache_configurator.py", 3): _absent(
                "mamba_layer_ids=self._get_mamba_layer_ids_for_req_pool(),"
            ),
        },
        unreviewed={},
        fuzzed=((HELPERS, "dflash_utils.py", 4),),  # 3 before API 2 imported load_ddtree
        also_rewritten=(TREE_MASK,),
    ),
)
LINEAGE_IDS = [f"{case.source}-to-{case.release}" for case in LINEAGES]


def _port_with_rewrites(base: Path, case: Lineage) -> PortReport:
    """The port of the shipped source set with the release's reviewed rewritten patches, its
    manifest naming the release's files and hashes (the rewritten patches start from the
    release's bytes, so the hash chain of every target runs through them; the port reads no
    hash)."""
    root = shipped_sets_root(base, case.source)
    source = root / case.source
    for name in case.rewritten:
        shutil.copy(patch_sets_root() / case.release / name, source / name)
    series = series_of(source)
    files = {p["name"]: p["files"] for p in series_of(patch_sets_root() / case.release)["patches"]}
    for entry in series["patches"]:
        entry["files"] = files[entry["name"]]
    (source / "series.yaml").write_text(yaml.safe_dump(series, sort_keys=False))
    return port_patch_set(case.release, root=root, wheel=wheel_path(case.release))


@pytest.fixture(scope="module", params=LINEAGES, ids=LINEAGE_IDS)
def lineage(request: pytest.FixtureRequest) -> Lineage:
    case: Lineage = request.param
    return case


@pytest.fixture(scope="module")
def plain_port(lineage: Lineage, tmp_path_factory: pytest.TempPathFactory) -> PortReport:
    root = shipped_sets_root(tmp_path_factory.mktemp("port"), lineage.source)
    return port_patch_set(lineage.release, root=root, wheel=wheel_path(lineage.release))


def _key(gate: Any) -> GateKey:
    return (str(gate.file), gate.function, gate.text)


def _hunk(hunk: Any) -> HunkKey:
    return (hunk.fit.patch, hunk.file.name, hunk.fit.index)


def test_port_fails_only_at_the_rewritten_hunks(lineage: Lineage, plain_port: PortReport) -> None:
    assert {_hunk(h): h.fit.mismatch for h in plain_port.failed} == lineage.failed
    statuses = {_hunk(h): h.status for h in plain_port.hunks}
    assert all(statuses[key] is HunkStatus.fuzzed for key in lineage.fuzzed)
    if lineage.hunks is not None:
        assert len(plain_port.hunks) == lineage.hunks
    assert plain_port.candidate is None and plain_port.exit_code == 5


def test_port_gates_are_the_reviewed_sets(lineage: Lineage, plain_port: PortReport) -> None:
    """The sites the port left unreviewed are the ones the release's set reviews new, but for the
    lines the patches write (the port scanned no patched text, as hunks failed), which that set
    reviews covered; every review carried over keeps its disposition; the reviews left behind
    are the sites the release no longer has, plus those of the lines the patches write."""
    reviewed = {_key(g): g for g in load_patch_set(patch_sets_root() / lineage.release).gates}
    shipped = {_key(g) for g in load_patch_set(patch_sets_root() / lineage.source).gates}
    new = {k for k in reviewed if k not in shipped}
    written = {k for k in new if "DDTREE" in k[2]}
    unreviewed = {_key(g.site) for g in plain_port.unreviewed}
    assert unreviewed == new - written
    assert all(reviewed[k].disposition.value == "covered" for k in written)
    assert Counter(reviewed[k].disposition.value for k in unreviewed) == lineage.unreviewed
    for gate in plain_port.gates:
        if gate.review is not None:
            assert reviewed[_key(gate.site)].disposition is gate.review.disposition
    dropped = {_key(r) for r in plain_port.dropped_reviews}
    gone = shipped - set(reviewed)
    assert gone and gone <= dropped
    assert all(k in reviewed and "DDTREE" in k[2] for k in dropped - gone)


def test_port_with_rewrites_regenerates_the_reviewed_set(lineage: Lineage, tmp_path: Path) -> None:
    """Every patch the release's set did not rewrite ports to exactly its reviewed diff, and the
    rewritten ones come back unchanged: names, hashes, text and gate sites."""
    port = _port_with_rewrites(tmp_path, lineage)
    candidate = port.candidate
    assert candidate is not None and not port.failed
    reviewed = load_patch_set(patch_sets_root() / lineage.release)
    assert [p.name for p in candidate.patches] == [p.name for p in reviewed.patches]
    for made, shipped in zip(candidate.patches, reviewed.patches, strict=True):
        assert [(f.path, f.sha256_before, f.sha256_after) for f in made.files] == [
            (f.path, f.sha256_before, f.sha256_after) for f in shipped.files
        ], made.name
        assert made.text == shipped.diff_path.read_text(), made.name
    assert {_key(g.site) for g in candidate.gates} == {_key(g) for g in reviewed.gates}
