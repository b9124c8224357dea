"""The polled gates: unit active -> `/health` -> `/get_server_info` as asked -> `/health_generate`.

Each gate waits `initial_delay_s`, then asks every `interval_s` until the answer is right or
`timeout_s` has passed (failed, with the last answer). A wrong answer that waiting cannot fix
(the server runs another algorithm, a crash loop) fails at once. The HTTP checks reach the port
through `hosts.tunnel` (see `validation.access`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ddtree_deploy.config.schema import (
    Algo,
    DeployConfig,
    GateAccess,
    GateTimingConfig,
    TreeMode,
)
from ddtree_deploy.errors import DeployError
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.service import systemd
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.validate.client import SglangClient
from ddtree_deploy.validate.gates import GateResult, Outcome


@dataclass(frozen=True)
class Attempt:
    """One try of a polled gate; `final` marks a wrong answer that waiting will not fix."""

    ok: bool
    detail: str
    final: bool = False
    figures: dict[str, Any] = field(default_factory=dict)
    gate: str | None = None  # the gate this answer really belongs to (a crash during /health)


def poll(
    gate: str,
    timing: GateTimingConfig,
    attempt: Callable[[], Attempt],
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> GateResult:
    """Run `attempt` on `timing`'s schedule until it passes, fails for good, or time runs out."""
    sleep(timing.initial_delay_s)
    start = clock()
    tries = 0
    while True:
        tries += 1
        try:
            last = attempt()
        except DeployError as err:  # unreachable or a malformed answer: maybe not up yet
            last = Attempt(False, str(err))
        waited = clock() - start
        figures = {**last.figures, "tries": tries, "waited_s": round(waited, 2)}
        if last.ok:
            return GateResult(gate, Outcome.passed, last.detail, figures)
        if last.final:
            return GateResult(last.gate or gate, Outcome.failed, last.detail, figures)
        if waited + timing.interval_s > timing.timeout_s:
            return GateResult(
                gate,
                Outcome.failed,
                f"{last.detail} (still so after {waited:.0f} s; timeout {timing.timeout_s:g} s)",
                figures,
            )
        sleep(timing.interval_s)


@dataclass(frozen=True)
class Expected:
    """What `/get_server_info` must report for the deployed algorithm."""

    fields: dict[str, Any]

    @classmethod
    def of(cls, deploy: DeployConfig) -> Expected:
        algo = deploy.algo
        fields: dict[str, Any] = {"speculative_algorithm": algo.name.value}
        if algo.name is Algo.DDTREE:
            shadow = algo.mode is TreeMode.shadow_linear
            fields.update(
                speculative_ddtree_mode=algo.mode.value,
                # SGLang pins shadow_linear to the chain: top-k 1, budget block_size - 1.
                speculative_ddtree_budget=algo.block_size - 1 if shadow else algo.budget,
                speculative_ddtree_topk=1 if shadow else algo.topk,
                speculative_ddtree_allow_hybrid_unsafe=algo.allow_hybrid_unsafe,
            )
            if deploy.sglang.ddtree_max_budget is not None:
                # A set that widens the tree verify reports the target's verify width (a flat
                # field of /server_info, 0.5.23's resolved_dict too): budget + 1 past the block.
                fields["speculative_num_draft_tokens"] = (
                    algo.block_size if shadow else max(algo.block_size, algo.budget + 1)
                )
        return cls(fields)

    def mismatches(self, info: dict[str, Any]) -> list[str]:
        return [
            f"{key}={info.get(key)!r} (asked for {want!r})"
            for key, want in self.fields.items()
            if info.get(key) != want
        ]


class ServiceProbe:
    """Runs the polled gates of one host's SGLang service."""

    def __init__(self, cfg: DeployConfig, host: ShellHost, api_key: Secret | None) -> None:
        self.cfg = cfg
        self.host = host
        self.api_key = api_key

    @contextlib.contextmanager
    def client(self) -> Iterator[SglangClient]:
        """An HTTP client for the service, through the access `validation.access` names."""
        svc, val = self.cfg.service, self.cfg.validation
        if val.access is GateAccess.direct or self.cfg.host.address is None:
            address = self.cfg.host.address or svc.listen_host
            with SglangClient(
                f"http://{address}:{svc.port}",
                api_key=self.api_key,
                timeout_s=val.request_timeout_s,
            ) as client:
                yield client
            return
        # Imported here: the SSH stack loads only when a gate goes through a tunnel.
        from ddtree_deploy.hosts.tunnel import forwarded_port

        with (
            forwarded_port(self.host, svc.listen_host, svc.port) as port,
            SglangClient(
                f"http://127.0.0.1:{port}", api_key=self.api_key, timeout_s=val.request_timeout_s
            ) as client,
        ):
            yield client

    def first_gates(self, expected: Expected) -> list[GateResult]:
        """unit active, health, server info, health_generate; stops after the first failure.

        On a host without systemd management (`host.systemd=false`: a process someone else
        starts, such as the GPU lab's) there is no unit to ask, so the chain starts at /health.
        """
        val = self.cfg.validation
        results: list[GateResult] = []
        restarts: int | None = None
        if self.cfg.host.systemd:
            results.append(poll("unit_active", val.unit_active, self._unit_active))
            if results[-1].outcome is not Outcome.passed:
                return results
            restarts = int(results[-1].figures["restarts"])
        with self.client() as client:
            checks: list[tuple[str, GateTimingConfig, Callable[[], Attempt]]] = [
                ("health", val.health, lambda: self._health(client, restarts)),
                ("server_info", val.server_info, lambda: _server_info(client, expected)),
                (
                    "health_generate",
                    val.health_generate,
                    lambda: _status(client.health_generate(), "/health_generate"),
                ),
            ]
            for name, timing, attempt in checks:
                results.append(poll(name, timing, attempt))
                if results[-1].outcome is not Outcome.passed:
                    break
        return results

    def _health(self, client: SglangClient, restarts: int | None) -> Attempt:
        """`/health` 200; while it is not, a unit that restarted or died fails the unit gate."""
        try:
            answer = _status(client.health(), "/health")
        except DeployError as err:
            answer = Attempt(False, str(err))
        if answer.ok or restarts is None:
            return answer
        unit = self._unit_active()
        if unit.figures["restarts"] > restarts or not unit.ok:
            again = unit.figures["restarts"] - restarts
            return Attempt(
                False,
                f"{unit.detail} while /health was not answering"
                + (f", after {again} restart(s)" if again else "")
                + ": the server process exits (crash loop)",
                final=True,
                figures=unit.figures,
                gate="unit_active",
            )
        return answer

    def _unit_active(self) -> Attempt:
        unit = f"{self.cfg.service.unit_name}.service"
        state = systemd.unit_state(self.host, unit)
        detail = f"{unit} on {self.host.name} is {state.describe()}"
        figures = {"main_pid": state.main_pid, "restarts": state.n_restarts}
        if state.running:
            return Attempt(True, detail, figures=figures)
        return Attempt(False, detail, final=state.active_state == "failed", figures=figures)


def _status(code: int, path: str) -> Attempt:
    return Attempt(code == 200, f"{path} answered HTTP {code}", figures={"status": code})


def _server_info(client: SglangClient, expected: Expected) -> Attempt:
    info = client.server_info()
    reported = {key: info.get(key) for key in expected.fields}
    figures = {"reported": reported, "version": info.get("version")}
    if wrong := expected.mismatches(info):
        return Attempt(
            False,
            "/get_server_info reports " + ", ".join(wrong),
            final=True,
            figures=figures,
        )
    summary = ", ".join(f"{k.removeprefix('speculative_')}={v}" for k, v in reported.items())
    return Attempt(True, f"/get_server_info reports {summary}", figures=figures)
