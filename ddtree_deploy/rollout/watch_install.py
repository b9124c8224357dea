"""Install the re-validation timer beside the unit once a deploy has promoted a generation, and
refresh it when a deploy finds the host already at its config but the timer's files differ (only
`watch.*` changed: the config hash leaves the watch out, so nothing else restarts).

Only where the service is managed (`host.systemd=true`), the watch is on (`watch.enabled`) and
ddtree-deploy is installed on the host at `watch.command` (the timer runs there, see
`watch.timer`); otherwise the deploy says why in a note and goes on. Re-installing restarts the
timer, so a deploy also resumes a timer that `watch.policy=pause` stopped.
"""

from __future__ import annotations

from ddtree_deploy.config.schema import DeployConfig
from ddtree_deploy.events import emit
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.service import systemd
from ddtree_deploy.watch.timer import render_watch


def install_watch(cfg: DeployConfig, host: ShellHost) -> str | None:
    """Install (or refresh) and start the timer; returns the sentence the run reports, None
    where no service is managed or the watch is off."""
    if not cfg.host.systemd or not cfg.watch.enabled:
        return None
    if not host.run(["test", "-x", cfg.watch.command], check=False).ok:
        note = (
            f"The re-validation timer was not installed: {cfg.watch.command} is not on "
            f"{host.name}; install ddtree-deploy there (docs/watch.md) or set "
            "watch.enabled=false."
        )
        emit("watch.not_installed", reason=note)
        return note
    files = render_watch(cfg)
    host.write_atomic(files.config_path, files.config_text, mode=0o600, sudo=True)
    host.write_atomic(files.service_path, files.service_text, mode=0o644, sudo=True)
    host.write_atomic(files.timer_path, files.timer_text, mode=0o644, sudo=True)
    systemd.daemon_reload(host)
    systemd.enable(host, files.timer)
    host.run(["systemctl", "restart", "--", files.timer], sudo=True)
    emit("watch.installed", timer=files.timer, interval=cfg.watch.interval)
    return (
        f"Re-validation timer {files.timer} runs every {cfg.watch.interval} "
        f"(watch.policy={cfg.watch.policy.value})."
    )


def refresh_watch(cfg: DeployConfig, host: ShellHost) -> str | None:
    """On a deploy that changed nothing: `install_watch` where the host's timer files are not
    what `cfg` renders (a changed interval, policy or sample), else None without touching it."""
    if not cfg.host.systemd or not cfg.watch.enabled:
        return None
    files = render_watch(cfg)
    rendered = ((files.config_path, files.config_text), (files.service_path, files.service_text),
                (files.timer_path, files.timer_text))  # fmt: skip
    if all(host.read_text(path, sudo=True) == text for path, text in rendered):
        return None
    return install_watch(cfg, host)
