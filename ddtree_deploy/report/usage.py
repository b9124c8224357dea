"""What `ddtree-deploy --help` prints: the config groups with their options, the actions and
where the docs are, on one 80x40 screen (the reference itself lives in docs/)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from ddtree_deploy.config import ACTIONS, GroupOptions
from ddtree_deploy.config.schema import FLEET_ACTIONS

WIDTH = 80

# One line per action (docs/actions.md has the whole story); keyed like config.ACTIONS.
ACTION_SUMMARIES = {
    "plan": "probe the host, show preflight and what each step would do",
    "facts": "print the host probe (output=json for JSON)",
    "prepare": "build the staging host's SGLang venv (staging hosts only)",
    "render": "print the unit and env file with their lint (output=json)",
    "deploy": "patch, kernels, unit, restart, gates; a failed gate rolls back",
    "rollback": "back to the previous generation (rollback.to_linear=true)",
    "status": "generation, unit, patch set, kernels, drift (exit 1), lock",
    "build-kernels": "build, install and smoke-test ddtree-kernels on the host",
    "patch": "apply the release's patch set (all files or none)",
    "unpatch": "restore the release's pristine SGLang files",
    "audit": "check SGLang's files and DFLASH gates against the patch set",
    "validate": "run the gates against the service as it runs now",
    "port": "port the nearest reviewed set to sglang.version=X (no host)",
    "tune": "sweep tune.budgets x tune.topks live; promote the fastest",
}

_HEAD = """\
usage: ddtree-deploy [--cfg job] [GROUP=OPTION] [KEY=VALUE] ...
Puts DDTree speculative decoding onto SGLang GPU hosts. Arguments are Hydra
overrides: GROUP=OPTION picks conf/GROUP/OPTION.yaml, KEY=VALUE sets one key.
"""

_TAIL = """\
Docs: README.md and docs/ in the source (docs/configuration.md: every key and
its default; docs/troubleshooting.md: every exit code and what to do)."""


def usage_text(groups: Sequence[GroupOptions]) -> str:
    """The help screen; `groups` come from `config.group_options()`."""
    name_width = max(len(a) for a in ACTIONS) + 2
    actions = [f"  {a:<{name_width}}{ACTION_SUMMARIES.get(a, '')}".rstrip() for a in ACTIONS]
    group_width = max(len(g.group) for g in groups) + 2
    rows = []
    for g in groups:
        options = " ".join(o + ("*" if o == g.default else "") for o in g.options)
        rows += textwrap.wrap(
            options,
            WIDTH,
            initial_indent=f"  {g.group:<{group_width}}",
            subsequent_indent=" " * (2 + group_width),
        )
    fleet = (
        "fleet=NAME instead of host=: the action on every host of conf/fleet/NAME.yaml, "
        f"canary first ({' '.join(FLEET_ACTIONS)}; docs/fleet.md)."
    )
    return "\n".join(
        [
            _HEAD.rstrip("\n"),
            *textwrap.wrap(fleet, WIDTH),
            "",
            "actions (action=NAME, default plan):",
            *actions,
            "",
            "config groups (* the default; host= also picks gpu, abi, model, sglang):",
            *rows,
            "",
            _TAIL,
        ]
    )
