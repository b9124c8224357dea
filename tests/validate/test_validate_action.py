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


def test_validate_fails_a_diverging_tree_with_the_first_divergence(
    standin_root: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = standin_root[0]
    for algo, args, env in (
        ("algo=dflash", ("--speculative-algorithm", "DFLASH"), None),
        ("algo=ddtree", ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-topk", "4"),
         {"STANDIN_FAULT": "tree_divergence"}),
    ):  # fmt: skip
        server = _serve(root, tmp_path, *args, env=env)
        try:
            code = _validate(
                tmp_path, server.url.rsplit(":", 1)[1], algo, "validation.concurrency=2"
            )
        finally:
            server.process.terminate()
            server.process.wait(timeout=30)
    assert code == 10
    gate = _report(tmp_path)["phases"][0]["gates"][-1]
    assert (gate["gate"], gate["outcome"]) == ("tree", "failed")
    assert gate["divergence"]["position"] == 5
    assert "diverges at token 5" in capsys.readouterr().err


def test_validate_refuses_a_staging_host_where_no_server_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["action=validate", f"rollout.runs_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: action=validate judges a running SGLang server, and local is a staging host "
        "where none runs; point it at a host that serves (host.staging=false)."
    )
