"""The fleet journal on the controller: where a rollout stands, so a killed one can resume.

`<runs_dir>/fleet-<name>.journal.json` holds the command (action and overrides), the run folder
of the run that began the rollout, each host's verdict so far and the generation it had before
the rollout touched it (where `on_failure=rollback_all` returns it), and whether the rollout is
complete (every host finished). It is rewritten whole (temp file, then rename) before a host
starts and after it ends, so a kill at any moment leaves the last complete picture. The next
run of the same command continues an incomplete rollout: hosts already finished are not run
again (`fleet.restart=true` runs them all); each host's own journal finishes or undoes whatever
the killed run left on it. After a complete rollout, the next run starts a new one.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.fleet.strategy import FINISHED, Verdict

# Actions whose rollout can be resumed (the read-only ones simply run again).
RESUMABLE = frozenset({"deploy", "rollback", "tune"})
_RESTART = re.compile(r"^\+*fleet\.restart=")


def command_key(args: Sequence[str]) -> list[str]:
    """What makes two runs "the same command": their overrides, bar `fleet.restart`."""
    return [arg for arg in args if not _RESTART.match(arg)]


class FleetBusy(DeployError):
    """Another run on this controller is rolling the same fleet out."""

    exit_code = ExitCode.HOST_BUSY  # as a host another run holds


class FleetJournal:
    """One fleet's journal file; thread-safe (hosts of a batch record at once)."""

    def __init__(self, path: Path, command: Sequence[str], run_dir: Path) -> None:
        self.path = path
        self.command = list(command)
        self._lock = threading.Lock()
        self.resumed_from: str | None = None
        self.hosts: dict[str, dict[str, Any]] = {}
        self._own_run_dir = self.run_dir = str(run_dir)
        self._resume()
        self.complete = False

    @classmethod
    def for_fleet(
        cls, runs_dir: Path, fleet: str, command: Sequence[str], run_dir: Path
    ) -> FleetJournal:
        return cls(runs_dir / f"fleet-{fleet}.journal.json", command, run_dir)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the fleet's rollout for the block (`flock` on `<journal>.lock`), so two runs of
        one fleet on this controller never write one journal; a second is refused, not queued."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with lock_path.open("a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                raise FleetBusy(
                    f"{self.path.name} is held by {holder} on this controller, which is rolling "
                    "this fleet out now; wait for it to finish (each host keeps its own lock)."
                ) from None
            lock.truncate(0)
            lock.write(f"pid {os.getpid()}\n")
            lock.flush()
            with self._lock:  # read again under the lock: the last run may have just ended
                self.resumed_from, self.hosts, self.run_dir = None, {}, self._own_run_dir
                self._resume()
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def finished(self) -> set[str]:
        """Hosts an earlier run of this rollout finished (changed or already as asked)."""
        return {name for name, e in self.hosts.items() if e.get("verdict") in FINISHED}

    def before(self, name: str) -> int | None:
        """The generation `name` had before this rollout first touched it (None: none known)."""
        value = self.hosts.get(name, {}).get("before")
        return int(value) if value is not None else None

    def knows_before(self, name: str) -> bool:
        return "before" in self.hosts.get(name, {})

    def verdict(self, name: str) -> Verdict | None:
        value = self.hosts.get(name, {}).get("verdict")
        return Verdict(value) if value is not None else None

    def record(self, name: str, **fields: Any) -> None:
        """Update `name`'s entry (a `before` already recorded is kept) and rewrite the file."""
        with self._lock:
            entry = self.hosts.setdefault(name, {})
            if "before" in fields and "before" in entry:
                fields = {k: v for k, v in fields.items() if k != "before"}
            entry.update({k: v.value if isinstance(v, Verdict) else v for k, v in fields.items()})
            self._write()

    def close(self, verdicts: Sequence[Verdict]) -> None:
        """End this run's part: the rollout is complete when every host finished."""
        with self._lock:
            self.complete = all(v in FINISHED for v in verdicts)
            self._write()

    def start_over(self) -> None:
        """Forget the rollout this run would have continued (`fleet.restart=true`)."""
        with self._lock:
            self.hosts, self.resumed_from = {}, None

    def _resume(self) -> None:
        """Take over the rollout the journal file holds, when it is this command's, unfinished."""
        previous = self._load()
        if (
            previous is not None
            and previous.get("command") == self.command
            and not previous.get("complete")
        ):
            self.resumed_from = str(previous.get("run_dir"))
            self.hosts = previous.get("hosts", {})
            self.run_dir = self.resumed_from

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "command": self.command,
            "run_dir": self.run_dir,
            "complete": self.complete,
            "hosts": self.hosts,
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.path)

    def _load(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
