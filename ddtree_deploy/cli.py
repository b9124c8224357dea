"""The `ddtree-deploy` command: compose the config, run one action, print, exit.

The single error boundary: a `DeployError` prints one red sentence (plus its hint) and exits
with its code (`HYDRA_FULL_ERROR=1` adds the traceback behind it); anything else is a bug and
keeps its traceback. Arguments are Hydra overrides (`host=ct200 algo=ddtree action=plan`),
composed through Hydra's compose API so that every composition error can be turned into one
sentence; of Hydra's application flags only `--cfg job` (print the composed config) is kept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

from omegaconf import OmegaConf

from ddtree_deploy.config import DeployConfig, compose_config, group_options
from ddtree_deploy.config.schema import OnFailure
from ddtree_deploy.config.stored import load_stored_config
from ddtree_deploy.errors import ConfigError, DeployError, ExitCode
from ddtree_deploy.events import JsonLinesSink, bound_emit, emit, sink_installed
from ddtree_deploy.fleet import (
    ActionDriver,
    FleetJournal,
    FleetMember,
    FleetResult,
    compose_members,
    fleet_level,
    walk,
)
from ddtree_deploy.fleet.journal import RESUMABLE, command_key
from ddtree_deploy.hosts.lock import HostBusy
from ddtree_deploy.report import console, render
from ddtree_deploy.report.action_run import run_action
from ddtree_deploy.report.fleet_report import write_fleet_reports
from ddtree_deploy.report.usage import usage_text
from ddtree_deploy.rollout.outcomes import PlanOutcome, StatusOutcome
from ddtree_deploy.service.secret import load_api_key


def main(argv: Sequence[str] | None = None) -> int:
    """Run one action; returns the exit code (testable without `sys.exit`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        console.stdout.print(usage_text(group_options()), markup=False, soft_wrap=True)
        return 0
    # Library loggers (paramiko's transport thread above all) go to the run's debug.log, never
    # to the terminal, where they would print tracebacks for expected failures.
    root_logger = logging.getLogger()
    root_logger.addHandler(logging.NullHandler())
    try:
        stored, args = _stored_argument(args)
        args, print_config = _without_flags(args)
        if stored is not None:  # the watch timer's run on the host (docs/watch.md)
            cfg, members = load_stored_config(stored, args), []
        else:
            fleet_args = fleet_level(args)  # a fleet's hosts are composed and checked one by one
            cfg = compose_config(args if fleet_args is None else fleet_args)
            members = compose_members(cfg.fleet, args) if cfg.fleet is not None else []
        if print_config:
            _print_config(cfg, members)
            return 0
        run_dir = _run_dir(cfg)  # only once the whole configuration is known good
        log_handler = logging.FileHandler(run_dir / "debug.log")
        log_handler.setFormatter(
            logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
        )
        root_logger.addHandler(log_handler)
        root_logger.setLevel(logging.DEBUG)
        sink = JsonLinesSink(run_dir / "events.jsonl")
        try:
            with sink_installed(sink):
                if cfg.fleet is not None:
                    return _run_fleet(cfg, members, args, run_dir)
                with sink_installed(_progress), _watch_runs_pruned(cfg, run_dir):
                    return _run(cfg, args, run_dir)
        finally:
            sink.close()
            root_logger.removeHandler(log_handler)
            log_handler.close()
    except DeployError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the traceback behind the sentence
            traceback.print_exception(err, file=sys.stderr)
        console.print_error(err)
        return err.exit_code
    except KeyboardInterrupt:
        console.stderr.print("interrupted", style="red")
        return ExitCode.INTERRUPTED


def _stored_argument(args: list[str]) -> tuple[Path | None, list[str]]:
    """`--from FILE`: the configuration a deploy stored for the watch timer, and the rest."""
    if "--from" not in args:
        return None, args
    at = args.index("--from")
    if at + 1 >= len(args):
        raise ConfigError("--from needs the stored configuration's path after it.")
    return Path(args[at + 1]), args[:at] + args[at + 2 :]


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())


def _without_flags(args: list[str]) -> tuple[list[str], bool]:
    """The overrides without `--cfg job`, and whether it was given. Hydra's other application
    flags are refused: a run is not a Hydra job (no output dir, no multirun, no completion)."""
    overrides, print_config, rest = [], False, iter(args)
    for arg in rest:
        flag = arg
        if arg in ("--cfg", "-c"):
            flag = f"{arg} {next(rest, '')}".strip()
        if flag in ("--cfg job", "-c job", "--cfg=job"):
            print_config = True
        elif flag.startswith("-"):
            raise ConfigError(
                f"ddtree-deploy takes Hydra overrides (key=value), not Hydra's flag {flag}; "
                "of its flags only --cfg job (print the composed config) is kept, and several "
                "hosts are one fleet= run, not a multirun."
            )
        else:
            overrides.append(arg)
    return overrides, print_config


def _print_config(cfg: DeployConfig, members: list[FleetMember]) -> None:
    """`--cfg job`: the composed config as YAML, the API key masked wherever it appears (the
    config holds only where the key is read from); a fleet's hosts one after the other."""
    configs = [(m.name, m.cfg) for m in members] or [(cfg.host.name, cfg)]
    for name, host_cfg in configs:
        if cfg.fleet is not None:
            console.print_line(f"# fleet {cfg.fleet.name}, host {name}")
        try:
            api_key = load_api_key(host_cfg.service)
        except ConfigError:  # unset here: nothing of it can be in the config
            api_key = None
        tree = OmegaConf.to_container(OmegaConf.structured(host_cfg), enum_to_str=True)
        masked = _map_strings(tree, api_key.mask) if api_key else tree
        assert isinstance(masked, dict)  # a structured config's container is a mapping
        text = OmegaConf.to_yaml(OmegaConf.create(masked))  # quotes '***', a YAML alias bare
        console.stdout.print(text, markup=False, highlight=False, soft_wrap=True, end="")


def _map_strings(node: object, change: Callable[[str], str]) -> object:
    """`node` (nested dicts and lists) with `change` applied to every string in it."""
    if isinstance(node, dict):
        return {key: _map_strings(value, change) for key, value in node.items()}
    if isinstance(node, list):
        return [_map_strings(value, change) for value in node]
    return change(node) if isinstance(node, str) else node


def _run(cfg: DeployConfig, args: list[str], run_dir: Path) -> int:
    emit("run.start", action=cfg.action, host=cfg.host.name, overrides=args)
    run = run_action(cfg, run_dir, show=True)
    if run.error is not None:
        raise run.error
    assert run.outcome is not None, "an action returns its outcome or raises"
    emit("run.end", exit_code=run.outcome.exit_code)
    return run.outcome.exit_code


def _progress(record: dict[str, object]) -> None:
    """Progress lines for long steps (events that carry a `message`)."""
    message = record.get("message")
    event = str(record.get("event", ""))
    if isinstance(message, str) and event.startswith(("prepare.", "kernels.")):
        console.stderr.print(f"[dim]>[/] {message}", highlight=False)


def _run_fleet(
    cfg: DeployConfig, members: list[FleetMember], args: list[str], run_dir: Path
) -> int:
    """The action on every host of the fleet (ddtree_deploy.fleet), a live table meanwhile,
    then the recap on stdout and as recap.{json,md,junit.xml} in the fleet's run folder."""
    fleet = cfg.fleet
    assert fleet is not None
    emit("run.start", action=cfg.action, fleet=fleet.name, overrides=args)
    journal = None
    if cfg.action in RESUMABLE:
        runs = Path(cfg.rollout.runs_dir)
        journal = FleetJournal.for_fleet(runs, fleet.name, command_key(args), run_dir)
    live = console.FleetLive()
    try:
        with sink_installed(live), journal.held() if journal is not None else nullcontext():
            driver = ActionDriver(
                {m.name: m.cfg for m in members},
                run_dir,
                bound_emit(),
                partial(run_action, show=False),
                record_before=fleet.on_failure is OnFailure.rollback_all,
            )
            result = walk(fleet, cfg.action, driver, journal)
    finally:
        live.close()
    _render_fleet(result)
    paths = write_fleet_reports(run_dir, result.to_dict())
    console.print_line(f"recap: {paths[1]}, {paths[0].name}, {paths[2].name}")
    emit("run.end", exit_code=result.exit_code)
    return result.exit_code


def _render_fleet(result: FleetResult) -> None:
    if result.action == "status":  # one table over the fleet
        rows = [
            (
                r.name,
                r.outcome.status if isinstance(r.outcome, StatusOutcome) else None,
                r.verdict.value,
                r.detail,
            )
            for r in result.hosts
        ]
        render.fleet_status_table(result.fleet, rows)
        return
    if result.action == "plan":
        for run in result.hosts:
            if isinstance(run.outcome, PlanOutcome):
                render.plan(run.name, run.outcome)
    render.fleet_recap(result.to_dict())


def _run_dir(cfg: DeployConfig) -> Path:
    """A new folder for this run: the stamp, host (or fleet) and action, then -1, -2... when
    runs started in the same second; claimed by mkdir itself, so runs started at once never
    share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = Path(cfg.rollout.runs_dir)
    try:
        runs.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # under /proc, a regular file, no permission...
        raise _unusable_runs_dir(runs, err) from err
    where = f"fleet-{cfg.fleet.name}" if cfg.fleet is not None else cfg.host.name
    name = f"{stamp}-{where}-{cfg.action}"
    suffix = 0
    while True:
        path = runs / (f"{name}-{suffix}" if suffix else name)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            suffix += 1
        except OSError as err:  # a folder, but not one this user can write to
            raise _unusable_runs_dir(runs, err) from err


@contextmanager
def _watch_runs_pruned(cfg: DeployConfig, run_dir: Path) -> Iterator[None]:
    """After an action=revalidate run (the watch timer's, every `watch.interval`), its host's
    older revalidate run folders beyond `watch.keep_runs` (this one included) are removed.
    Not after a run the host's lock turned away: another run is under way, and its folder
    may be older than this one's."""
    turned_away = False
    try:
        yield
    except HostBusy:
        turned_away = True
        raise
    finally:
        if cfg.action == "revalidate" and not turned_away:
            _prune_watch_runs(run_dir, cfg.host.name, cfg.watch.keep_runs)


def _prune_watch_runs(run_dir: Path, host: str, keep: int) -> None:
    """Remove the host's revalidate run folders older than `run_dir` beyond the newest
    `keep - 1`; never a newer one (a run started beside this one)."""
    # The names `_run_dir` gives them: the stamp, then -N where the name was taken.
    named = re.compile(rf"(\d{{8}}-\d{{6}})-{re.escape(host)}-revalidate(?:-(\d+))?")

    def started(path: Path) -> tuple[str, int] | None:
        found = named.fullmatch(path.name)
        return (found[1], int(found[2] or 0)) if found else None

    own = started(run_dir)
    if own is None:
        return
    older = sorted(
        (when, path)
        for path in run_dir.parent.iterdir()
        if (when := started(path)) is not None and when < own
    )
    removed = older[: max(0, len(older) - (keep - 1))]
    for _, path in removed:
        shutil.rmtree(path, ignore_errors=True)  # one left behind goes with the next run
    if removed:
        emit("watch.runs_pruned", removed=[path.name for _, path in removed])


def _unusable_runs_dir(runs: Path, err: OSError) -> ConfigError:
    return ConfigError(
        f"rollout.runs_dir={runs} cannot hold run folders ({err.strerror}); point it at a "
        "folder you can write to."
    )
