"""Run the lifecycle pipeline (no validation gates) in its own process, for tests that SIGKILL it.

`action=deploy` runs the validation gates, which need an HTTP server; the lifecycle tests'
double serves nothing, so they drive `pipeline.deploy(gates=[])` through this script instead:
`python pipeline_driver.py deploy|rollback OVERRIDE...`. Events go to `<runs_dir>/events.jsonl`
and errors print as the CLI prints them, with the same exit codes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ddtree_deploy.config import compose_config
from ddtree_deploy.errors import DeployError
from ddtree_deploy.events import JsonLinesSink, sink_installed
from ddtree_deploy.hosts.factory import connect
from ddtree_deploy.report import console
from ddtree_deploy.rollout.pipeline import deploy
from ddtree_deploy.rollout.rollback import rollback
from ddtree_deploy.service.secret import load_api_key


def main(action: str, overrides: list[str]) -> int:
    cfg = compose_config(overrides)
    sink = JsonLinesSink(Path(cfg.rollout.runs_dir) / "events.jsonl")
    try:
        api_key = load_api_key(cfg.service)  # as an action does: once, before it connects
        with sink_installed(sink), connect(cfg.host) as host:
            if action == "deploy":
                deploy(cfg, host, api_key=api_key, gates=[])
            else:
                rollback(cfg, host, api_key=api_key)
    except DeployError as err:
        console.print_error(err)
        return err.exit_code
    finally:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
