"""`action=validate` writes the host's metrics; `action=status output=prometheus` prints them.

The server is the SGLang stand-in (TEST DOUBLE: real SGLang cannot serve on a CPU), run as a
plain process on this machine as in tests/validate/test_validate_action.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from validate.conftest import key_file, start_local_standin

from ddtree_deploy.cli import main


def _run(tmp: Path, port: str, *extra: str) -> int:
    return main(
        [
            "host.systemd=false",
            "host.staging=false",
            "service.tp_size=0",
            f"host.state_dir={tmp / 'state'}",
            "validation.access=direct",
            f"service.port={port}",
            f"service.api_key_file={key_file(tmp)}",
            f"rollout.runs_dir={tmp / 'runs'}",
            f"watch.textfile_dir={tmp / 'textfile'}",
            *extra,
        ]
    )


def _values(text: str) -> dict[str, float]:
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name != "ddtree_gate_passed" and s.name != "ddtree_gate_timestamp_seconds"
    }


def test_validate_writes_metrics_that_count_runs_and_failures_across_runs(
    standin_root: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = start_local_standin(
        standin_root[0], tmp_path / "models", "--speculative-algorithm", "DFLASH"
    )
    port = server.url.rsplit(":", 1)[1]
    try:
        assert _run(tmp_path, port, "action=validate", "algo=dflash") == 0
        first = (tmp_path / "state" / "metrics.prom").read_text()
        assert (tmp_path / "textfile" / "ddtree_local.prom").read_text() == first
        assert not list((tmp_path / "textfile").glob("*.tmp*"))  # renamed into place
        values = _values(first)
        assert (values["ddtree_runs_total"], values["ddtree_failures_total"]) == (1, 0)
        assert values["ddtree_validation_passed"] == 1
        assert values["ddtree_baseline_tokens_per_second"] > 0
        # The config says DDTREE while DFLASH serves: server_info fails; counted, not lost.
        assert _run(tmp_path, port, "action=validate", "algo=ddtree_shadow") == 10
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)
    capsys.readouterr()
    assert _run(tmp_path, port, "action=status", "output=prometheus") == 0
    printed = capsys.readouterr().out
    assert printed == (tmp_path / "state" / "metrics.prom").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(printed)}
    verdicts = {s.labels["gate"]: s.value for s in fams["ddtree_gate_passed"].samples}
    assert verdicts["server_info"] == 0 and verdicts["baseline"] == 1
    values = _values(printed)
    assert (values["ddtree_runs_total"], values["ddtree_failures_total"]) == (2, 1)
    assert values["ddtree_validation_passed"] == 0
    assert values["ddtree_drift_parts"] == 0
