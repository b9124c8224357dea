"""`fleet=` composition: each host as `host=<option>` composes it, plus the fleet's and the
command line's overrides; bad fleets are one sentence. And the CLI over hosts that cannot be
reached (CT129 and CT200 do not resolve here): the recap and its files, exit code 3."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ddtree_deploy.cli import main
from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import OnFailure
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.fleet import compose_members, fleet_level

FLEET_DIR = "fleet"


def write_fleet(root: Path, text: str) -> str:
    (root / FLEET_DIR).mkdir(parents=True, exist_ok=True)
    (root / FLEET_DIR / "mixed.yaml").write_text(text)
    return f"hydra.searchpath=[file://{root}]"


def test_ct_fleet_composes_each_host_with_its_own_abi() -> None:
    cfg = compose_config(["fleet=ct", "action=deploy", "algo=dflash"])
    assert cfg.fleet is not None
    assert (cfg.fleet.canary, cfg.fleet.on_failure) == (["ct129"], OnFailure.halt)
    members = compose_members(cfg.fleet, ["fleet=ct", "action=deploy", "algo=dflash"])
    assert [(m.name, m.cfg.host.name, m.cfg.abi.cuda) for m in members] == [
        ("ct129", "ct129", "13.0"),
        ("ct200", "ct200", "12.8"),
    ]
    assert {m.cfg.algo.name.value for m in members} == {"DFLASH"}
    assert all(m.cfg.fleet is None and m.cfg.action == "deploy" for m in members)


def test_per_host_overrides_apply_to_that_host_and_the_command_line_wins(tmp_path: Path) -> None:
    searchpath = write_fleet(
        tmp_path,
        "defaults: [base_fleet, _self_]\nname: mixed\nhosts:\n"
        "  ct129: {overrides: [algo.budget=8, service.port=31000]}\n"
        "  second: {option: ct200, overrides: [host.name=ct200b, sglang=v0_5_14]}\n",
    )
    args = [searchpath, "fleet=mixed", "action=plan", "service.port=32000"]
    cfg = compose_config(args)
    assert cfg.fleet is not None
    first, second = compose_members(cfg.fleet, args)
    assert (first.cfg.algo.budget, first.cfg.service.port) == (8, 32000)
    assert (second.name, second.cfg.host.name, second.cfg.sglang.version) == (
        "second",
        "ct200b",
        "0.5.14",
    )
    assert second.cfg.algo.budget == 15


@pytest.mark.parametrize(
    ("yaml", "extra", "sentence"),
    [
        (
            "hosts: {ct129: {}}\ncanary: [ct300]\n",
            (),
            "fleet mixed's canary names 'ct300', which is not one of its hosts (ct129)",
        ),
        ("hosts: {}\n", (), "fleet mixed lists no hosts"),
        ("hosts: {ct129: {}}\n", ("fleet.batch_size=0",), "fleet.batch_size=0 is out of range"),
        ("hosts: {ct129: {}}\n", ("action=port",), "action=port acts on one host"),
        (
            "hosts: {ct129: {}, again: {option: ct129}}\n",
            (),
            "hosts ct129 and again both compose to host.name=ct129",
        ),
        ("hosts: {ct129: {}}\n", ("host=ct200",), "drop host= from the command line"),
        (
            "hosts: {ct129: {overrides: [algo.budget=0]}}\n",
            (),
            "fleet mixed, host ct129: algo.budget=0",
        ),
    ],
)
def test_bad_fleet_is_one_sentence(
    tmp_path: Path, yaml: str, extra: tuple[str, ...], sentence: str
) -> None:
    searchpath = write_fleet(tmp_path, f"defaults: [base_fleet, _self_]\nname: mixed\n{yaml}")
    args = [searchpath, "fleet=mixed", "action=deploy", *extra]
    with pytest.raises(ConfigError) as raised:
        cfg = compose_config(args)
        assert cfg.fleet is not None
        compose_members(cfg.fleet, args)
    assert sentence in str(raised.value)
    assert "\n" not in str(raised.value)


def test_unreachable_fleet_reports_every_host_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["fleet=ct", "action=deploy", f"rollout.runs_dir={tmp_path}", "host.connect_timeout_s=2"]
    )
    assert rc == 3
    out = capsys.readouterr().out
    assert "fleet ct: action=deploy" in out
    (run_dir,) = tmp_path.glob("*-fleet-ct-deploy")
    recap = json.loads((run_dir / "recap.json").read_text())
    # The canary failed, so CT200 never started.
    assert [(h["host"], h["verdict"]) for h in recap["hosts"]] == [
        ("ct129", "unreachable"),
        ("ct200", "skipped"),
    ]
    assert recap["halted"] == "canary ct129 failed; no further batch started (on_failure=halt)."
    suite = ET.parse(run_dir / "recap.junit.xml").getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"ct129", "ct200"}
    assert cases["ct129"].find("failure") is not None
    assert cases["ct200"].find("skipped") is not None
    assert "| ct129 | 1 | unreachable |" in (run_dir / "recap.md").read_text()
    assert (run_dir / "ct129" / "events.jsonl").is_file()
    journal = json.loads((tmp_path / "fleet-ct.journal.json").read_text())
    assert journal["complete"] is False and journal["hosts"]["ct129"]["verdict"] == "unreachable"


def test_fleet_level_config_leaves_host_overrides_to_each_host() -> None:
    args = ["fleet=ct", "host.transport=ssh", "algo=dflash", "action=deploy", "rollout.runs_dir=r"]
    assert fleet_level(args) == ["fleet=ct", "action=deploy", "rollout.runs_dir=r"]
    assert fleet_level(["host=ct129", "fleet.batch_size=2"]) is None  # no fleet named
