"""`action=validate` on a host whose server this tool does not start (host.systemd=false).

The server is the SGLang stand-in (TEST DOUBLE: real SGLang cannot serve on a CPU), started as a
plain process, as the GPU lab starts real servers. The product's own gates judge it: a linear
DFLASH server leaves a stored baseline; DDTREE servers are compared with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.cli import main
from validate.conftest import key_file, start_local_standin


def _validate(tmp: Path, port: str, *extra: str) -> int:
    return main(
        [
            "host.systemd=false",
            "host.staging=false",  # a server runs here (the stand-in), unlike on host=local
            "service.tp_size=0",  # no GPU to split over: the stand-in decodes on the CPU
            f"host.state_dir={tmp / 'state'}",
            "validation.access=direct",
            f"service.port={port}",
            f"service.api_key_file={key_file(tmp)}",
            f"rollout.runs_dir={tmp / 'runs'}",
            "action=validate",
            *extra,
        ]
    )


def _report(tmp: Path) -> dict[str, Any]:
    newest = max((tmp / "runs").glob("*-validate*/report.json"), key=lambda p: p.stat().st_mtime)
    data: dict[str, Any] = json.loads(newest.read_text())
    return data


def _serve(root: Path, tmp: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    models = tmp / f"models-{len(list(tmp.glob('models-*')))}"
    return start_local_standin(root, models, *args, env=env)


def test_validate_records_a_baseline_then_judges_ddtree_against_it(
    standin_root: tuple[Path, Path], tmp_path: Path
) -> None:
    root = standin_root[0]
    linear = _serve(root, tmp_path, "--speculative-algorithm", "DFLASH")
    port = linear.url.rsplit(":", 1)[1]
    try:
        # The config says DDTREE but DFLASH serves: server_info fails, nothing is stored.
        assert _validate(tmp_path, port, "algo=ddtree_shadow") == 10
        assert not list((tmp_path / "state").rglob("baseline-*.json"))
        assert _validate(tmp_path, port, "algo=dflash") == 0
    finally:
        linear.process.terminate()
        linear.process.wait(timeout=30)
    report = _report(tmp_path)
    assert report["decision"] == "passed"
    assert [g["gate"] for g in report["phases"][0]["gates"]] == [
        "health", "server_info", "health_generate", "baseline",
    ]  # fmt: skip
    assert len(list((tmp_path / "state" / "generations" / "0").glob("baseline-*.json"))) == 1

    tree = _serve(
        root, tmp_path, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-topk", "4"
    )
    try:
        port = tree.url.rsplit(":", 1)[1]
        assert _validate(tmp_path, port, "algo=ddtree") == 0
        assert _report(tmp_path)["phases"][0]["gates"][-1]["gate"] == "tree"
        # Another measurement setting has no stored baseline: refused in one sentence.
        assert _validate(tmp_path, port, "algo=ddtree", "validation.concurrency=2") == 10
        assert "no stored linear-DFlash baseline" in _report(tmp_path)["sentence"]
    finally:
        tree.process.terminate()
        tree.process.wait(timeout=30)


def _judge_tree_with_fault(
    root: Path, tmp_path: Path, fault: str, *overrides: str, baseline: bool = True
) -> tuple[int, dict[str, Any]]:
    """Validate linear DFlash (the baseline, unless one is stored), then a tree stand-in with
    `fault`; (exit code, the tree gate)."""
    code = 0
    linear = [("algo=dflash", ("--speculative-algorithm", "DFLASH"), None)] if baseline else []
    for algo, args, env in (
        *linear,
        ("algo=ddtree", ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-topk", "4"),
         {"STANDIN_FAULT": fault}),
    ):  # fmt: skip
        server = _serve(root, tmp_path, *args, env=env)
        try:
            code = _validate(tmp_path, server.url.rsplit(":", 1)[1], algo, *overrides)
        finally:
            server.process.terminate()
            server.process.wait(timeout=30)
    return code, _report(tmp_path)["phases"][0]["gates"][-1]


def test_validate_fails_a_tree_that_emits_a_wrong_token_and_names_it(
    standin_root: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, gate = _judge_tree_with_fault(
        standin_root[0], tmp_path, "tree_divergence", "validation.concurrency=2"
    )
    assert code == 10
    assert (gate["gate"], gate["outcome"]) == ("tree", "failed")
    assert gate["divergence"]["position"] == 5
    assert gate["figures"]["max_gap"] > gate["figures"]["tie_tolerance"]
    assert "emitted a token the target does not choose" in capsys.readouterr().err


def test_validate_passes_a_tree_that_flips_near_ties_and_reports_each_gap(
    standin_root: tuple[Path, Path], tmp_path: Path
) -> None:
    """bf16 near-ties flipped by tree verify (the stand-in's target has a few 0.05-nat ties):
    the tokens differ from linear DFlash's, every one is within the tolerance, the gate passes
    and its report lists each divergence with both tokens' scores."""
    # Speed is not what this judges: a flip leaves the drafter's path, so acceptance drops.
    slower = "validation.min_speedup=0.5"
    code, gate = _judge_tree_with_fault(standin_root[0], tmp_path, "tree_near_tie_flip", slower)
    assert code == 0, gate["sentence"]
    assert gate["outcome"] == "passed"
    assert "only at near-ties of the target" in gate["sentence"]
    diverged = [row for row in gate["figures"]["per_prompt"] if row["divergence"]]
    assert diverged and all(row["verdict"] == "near-tie" for row in diverged)
    assert all(row["divergence"]["gap"] == pytest.approx(0.05, abs=1e-6) for row in diverged)
    # With the tolerance below the ties, the same tree fails: the rule, not luck, passed it.
    code, gate = _judge_tree_with_fault(
        standin_root[0],
        tmp_path,
        "tree_near_tie_flip",
        slower,
        "validation.tie_tolerance=0.01",
        baseline=False,
    )
    assert (code, gate["outcome"]) == (10, "failed")


def test_validate_refuses_a_staging_host_where_no_server_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["action=validate", f"rollout.runs_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: action=validate judges a running SGLang server, and local is a staging host "
        "where none runs; point it at a host that serves (host.staging=false)."
    )


def test_a_batched_shadow_is_judged_by_the_tie_rule_and_a_single_request_exactly(
    standin_root: tuple[Path, Path], tmp_path: Path
) -> None:
    """GPU lab, run 16: with 32 requests in flight a correct shadow_linear diverged once from
    linear DFlash at a token the same server matched in the round before (the batch's make-up
    changes bf16 rounding). Batched, the gate scores the answers and passes a near-tie flip by
    the tie rule; at batch 1, where the two run the same shapes, it must match exactly."""
    root = standin_root[0]
    linear = _serve(root, tmp_path, "--speculative-algorithm", "DFLASH")
    try:
        port = linear.url.rsplit(":", 1)[1]
        for level in (1, 2):
            assert _validate(tmp_path, port, "algo=dflash", f"validation.concurrency={level}") == 0
    finally:
        linear.process.terminate()
        linear.process.wait(timeout=30)
    shadow = _serve(
        root,
        tmp_path,
        *("--speculative-algorithm", "DDTREE", "--speculative-ddtree-mode", "shadow_linear"),
        env={"STANDIN_FAULT": "near_tie_flip"},
    )
    # A flip leaves the drafter's path, so acceptance moves: this judges the tokens.
    loose = "validation.acceptance_tolerance=0.5"
    try:
        port = shadow.url.rsplit(":", 1)[1]
        assert (
            _validate(tmp_path, port, "algo=ddtree_shadow", loose, "validation.concurrency=2") == 0
        )
        gate = _report(tmp_path)["phases"][0]["gates"][-1]
        assert (gate["gate"], gate["outcome"]) == ("shadow_linear", "passed")
        assert "only at near-ties of the target" in gate["sentence"]
        assert gate["divergence"] is not None
        assert (
            _validate(tmp_path, port, "algo=ddtree_shadow", loose, "validation.concurrency=1") == 10
        )
        assert "Shadow-linear output differs from linear DFlash" in _report(tmp_path)["sentence"]
    finally:
        shadow.process.terminate()
        shadow.process.wait(timeout=30)
