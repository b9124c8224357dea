"""A linear-DFlash baseline is stored with the time it was measured, and the metrics show it:
the watch measures it again once it is older than `watch.baseline_max_age_h`.

The server is the SGLang stand-in (TEST DOUBLE: real SGLang cannot serve on a CPU), run as a
plain process on this machine (a staging host: host.systemd=false, no unit).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from validate.conftest import key_file, start_local_standin

from ddtree_deploy.cli import main


def test_validate_stores_the_baseline_with_its_time_and_exports_it(
    standin_root: tuple[Path, Path], tmp_path: Path
) -> None:
    server = start_local_standin(
        standin_root[0], tmp_path / "models", "--speculative-algorithm", "DFLASH"
    )
    try:
        before = time.time()
        code = main(
            [
                "host.systemd=false",
                "host.staging=false",
                "service.tp_size=0",
                f"host.state_dir={tmp_path / 'state'}",
                "validation.access=direct",
                f"service.port={server.url.rsplit(':', 1)[1]}",
                f"service.api_key_file={key_file(tmp_path)}",
                f"rollout.runs_dir={tmp_path / 'runs'}",
                "action=validate",
                "algo=dflash",
            ]
        )
        after = time.time()
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)
    assert code == 0
    (stored,) = (tmp_path / "state" / "generations" / "0").glob("baseline-*.json")
    measured_at = json.loads(stored.read_text())["measured_at"]
    assert before <= measured_at <= after
    text = (tmp_path / "state" / "metrics.prom").read_text()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["ddtree_baseline_timestamp_seconds"] == measured_at
    (report,) = (tmp_path / "runs").glob("*/report.json")
    (phase,) = json.loads(report.read_text())["phases"]
    assert phase["gates"][-1]["figures"]["measured_at"] == measured_at
