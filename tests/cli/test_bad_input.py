"""Bad input as a new user gives it: one sentence on stderr, exit 2, no traceback, no run folder.

Each case is the command line itself, run through `main` (the same boundary the console script
has); the config files with errors are written into a search-path folder of the test's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.cli import main

HOST_HEADER = "# @package _global_\ndefaults: [/host/base_host@host, _self_]\n"


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `args`; assert exit 2 and a one-line error without traceback; return the line."""
    code = main(list(args))
    captured = capsys.readouterr()
    assert code == 2, captured.err + captured.out
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0].removeprefix("error: ")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from an empty folder, so that a run folder made by mistake is seen (and kept out of
    the checkout)."""
    monkeypatch.chdir(tmp_path)


def _searchpath(tmp_path: Path, files: dict[str, str]) -> str:
    conf = tmp_path / "conf"
    for name, text in files.items():
        (conf / name).parent.mkdir(parents=True, exist_ok=True)
        (conf / name).write_text(text)
    return f"hydra.searchpath=[file://{conf}]"


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        (HOST_HEADER + "host:\n\tname: gpu7\n", "line 4, column 1", "found character '\\t'"),
        (HOST_HEADER + "host: {name: [gpu7, address: x}\n", "line 3, column 31", "expected ','"),
    ],
    ids=["tab", "unclosed-bracket"],
)
def test_yaml_error_in_a_host_file_names_file_line_and_column(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, where: str, problem: str
) -> None:
    path = _searchpath(tmp_path, {"host/gpu7.yaml": text})
    sentence = _refused(capsys, path, "host=gpu7")
    assert sentence.startswith(f"{tmp_path}/conf/host/gpu7.yaml, {where} is not valid YAML (")
    assert problem in sentence
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("runs_dir", ["/proc/ddtree-x", "regular-file"])
def test_unusable_runs_dir_is_one_sentence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs_dir: str
) -> None:
    (tmp_path / "regular-file").write_text("")
    sentence = _refused(capsys, f"rollout.runs_dir={runs_dir}")
    assert sentence.startswith(f"rollout.runs_dir={runs_dir} cannot hold run folders (")
    assert sentence.endswith("point it at a folder you can write to.")


@pytest.mark.parametrize(
    ("override", "nearest"),
    [
        ("+algo.bugdet=3", "algo.budget"),
        ("+validation.tie_tolerence=1", "validation.tie_tolerance"),
    ],
)
def test_added_key_the_schema_does_not_know_is_refused_with_the_nearest_key(
    capsys: pytest.CaptureFixture[str], override: str, nearest: str
) -> None:
    key = override[1:].split("=")[0]
    sentence = _refused(capsys, override)
    assert sentence == f"Config key {key} does not exist; did you mean {nearest}?"


def test_added_key_under_a_mapping_and_a_group_pick_with_plus_are_still_accepted() -> None:
    from ddtree_deploy.config import compose_config

    cfg = compose_config(["+service.environment.HF_HOME=/srv/hf", "host=ct200"])
    assert cfg.service.environment["HF_HOME"] == "/srv/hf"


@pytest.mark.parametrize("override", ["model.name=a;b", "model.name=modèle"])
def test_unquoted_value_hydra_cannot_lex_says_how_to_quote(
    capsys: pytest.CaptureFixture[str], override: str
) -> None:
    sentence = _refused(capsys, override)
    assert sentence.startswith(f"Cannot read the override {override!r}: ")
    assert "\"model.name='my model'\"" in sentence
    assert "LexerNoViableAlt" not in sentence


def test_searchpath_folder_that_does_not_exist_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-conf"
    sentence = _refused(capsys, f"hydra.searchpath=[file://{missing}]")
    assert sentence.startswith(f"hydra.searchpath names {missing}, which does not exist;")
    assert not (tmp_path / "runs").exists()  # refused, not warned about and run


@pytest.mark.parametrize(
    ("hosts", "said"),
    [
        ("hosts:\n", "fleet.hosts in fleet/f.yaml does not fit the schema: it is empty (null)"),
        ("hosts: [ct129]\n", "fleet/f.yaml does not fit the schema: a list stands where a mapping"),
    ],
    ids=["null", "list"],
)
def test_fleet_whose_hosts_is_not_a_mapping_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hosts: str, said: str
) -> None:
    fleet = "defaults: [base_fleet, _self_]\nname: f\n" + hosts
    sentence = _refused(capsys, _searchpath(tmp_path, {"fleet/f.yaml": fleet}), "fleet=f")
    assert sentence.startswith(said)
    assert "e.g. {ct129: {}}" in sentence


def test_fleet_refused_for_a_host_config_makes_no_run_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sentence = _refused(capsys, "fleet=ct", "model.tp=x")
    assert sentence.startswith("fleet ct, host ct129: ")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        (["--info"], "--info"),
        (["-m", "host=ct129,ct200"], "-m"),
        (["--cfg", "hydra"], "--cfg hydra"),
    ],
)
def test_hydra_flags_other_than_cfg_job_are_refused_in_one_sentence(
    capsys: pytest.CaptureFixture[str], flag: list[str], named: str
) -> None:
    sentence = _refused(capsys, *flag)
    assert sentence.startswith(
        f"ddtree-deploy takes Hydra overrides (key=value), not Hydra's flag {named};"
    )
    assert "--cfg job" in sentence


def test_cfg_job_prints_the_composed_config_with_the_api_key_masked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("I43_KEY", "sk-very-secret")
    code = main(
        [
            "--cfg",
            "job",
            "host=ct200",
            "algo=ddtree",
            "service.api_key_env=I43_KEY",
            "+service.environment.SGLANG_KEY=sk-very-secret",  # the key pasted where it should not be
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "sk-very-secret" not in out
    assert "SGLANG_KEY: '***'" in out
    assert "  name: ct200\n" in out and "api_key_env: I43_KEY" in out
    assert not (tmp_path / "runs").exists()  # printing the config is not a run


def test_cfg_job_on_a_fleet_prints_each_host_as_composed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["fleet=ct", "-c", "job"]) == 0
    out = capsys.readouterr().out
    assert "# fleet ct, host ct129\n" in out and "# fleet ct, host ct200\n" in out
    assert "  name: ct129\n" in out and "  name: ct200\n" in out


def test_hydra_full_error_shows_the_traceback_behind_the_sentence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    assert main(["algo.bugdet=3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "Could not override 'algo.bugdet'" in err  # Hydra's own error, under ours
    assert err.rstrip().splitlines()[-1].startswith("error: Config key algo.bugdet does not exist")


def test_host_file_whose_package_line_is_not_first_says_where_it_belongs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = "# my host\n" + HOST_HEADER + "host: {name: gpu7, sglang_venv: /v}\n"
    sentence = _refused(capsys, _searchpath(tmp_path, {"host/gpu7.yaml": text}), "host=gpu7")
    assert sentence.startswith("A host/ file of yours put its keys under host.host (")
    assert sentence.endswith(
        "its `# @package _global_` line must be the file's first line, above any other comment."
    )


def test_host_file_with_a_misspelt_key_names_the_file_and_the_nearest_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = HOST_HEADER + "host: {nmae: gpu7, sglang_venv: /v}\n"
    sentence = _refused(capsys, _searchpath(tmp_path, {"host/gpu7.yaml": text}), "host=gpu7")
    assert (
        sentence
        == "host/gpu7.yaml sets host.nmae, which is no key of the config; did you mean host.name?"
    )
