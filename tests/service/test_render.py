"""Rendering and linting without a host: every conf/ host x algo passes systemd-analyze."""

from __future__ import annotations

import shutil

import pytest

from ddtree_deploy.config import compose_config
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.service.lint import UnitLintFailed, lint_unit
from ddtree_deploy.service.quoting import env_assignment, exec_command, exec_word, unit_value
from ddtree_deploy.service.render import TEMPLATES, render_service
from ddtree_deploy.service.secret import Secret

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
HYBRID_OK = "algo.allow_hybrid_unsafe=true"  # ct hosts serve a hybrid target


@needs_analyze
@pytest.mark.parametrize("host", ["ct129", "ct200", "local"])
@pytest.mark.parametrize("algo", ["dflash", "ddtree", "ddtree_shadow"])
def test_rendered_unit_passes_verify_and_exposure(host: str, algo: str) -> None:
    cfg = compose_config([f"host={host}", f"algo={algo}", HYBRID_OK])
    rendered = render_service(cfg, Secret("sk-never-shown"))
    lint = lint_unit(rendered, cfg.service.max_exposure)
    assert lint.ok, lint.verify_findings
    assert lint.exposure is not None and lint.exposure <= cfg.service.max_exposure
    assert "sk-never-shown" not in rendered.unit_text + rendered.env_masked
    assert "-m ddtree_launch" in rendered.unit_text


def test_ddtree_arguments_follow_the_algo() -> None:
    cfg = compose_config(["host=ct200", "algo=ddtree", HYBRID_OK, "algo.budget=9"])
    argv = list(render_service(cfg, None).argv)
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "9"
    assert argv[argv.index("--speculative-ddtree-mode") + 1] == "tree"
    assert "--speculative-ddtree-allow-hybrid-unsafe" in argv
    assert "--api-key" not in argv
    linear = render_service(compose_config(["host=ct200", "algo=dflash"]), None).argv
    assert not any(a.startswith("--speculative-ddtree") for a in linear)


def test_proven_release_opens_the_servers_hybrid_gate_without_the_opt_in() -> None:
    """0.5.11 is proven on a hybrid target (the GPU lab): the product's own command composes,
    and the patched server's hybrid gate is opened for it; an unproven release needs the opt-in."""
    argv = list(render_service(compose_config(["host=ct200", "algo=ddtree"]), None).argv)
    assert "--speculative-ddtree-allow-hybrid-unsafe" in argv
    shadow = render_service(compose_config(["host=ct200", "algo=ddtree_shadow"]), None).argv
    assert "--speculative-ddtree-allow-hybrid-unsafe" not in shadow
    unproven = ["host=ct200", "sglang=v0_5_23", "algo=ddtree"]
    argv = list(render_service(compose_config([*unproven, HYBRID_OK]), None).argv)
    assert "--speculative-ddtree-allow-hybrid-unsafe" in argv


def test_unit_with_an_api_key_starts_the_launcher_and_holds_no_key_argument() -> None:
    """The key lives in the 0600 env file; the launcher hands it to SGLang in-process."""
    cfg = compose_config(["host=ct200", "algo=dflash"])
    keyed = render_service(cfg, Secret("sk-never-shown"))
    python = "/opt/sglang/venv/bin/python"
    assert keyed.argv[:7] == (
        python, "-m", "ddtree_launch", "--api-key-env", "SGLANG_API_KEY", "sglang.launch_server",
        "--model-path",
    )  # fmt: skip
    exec_start = [
        f"ExecStart={python} \\",
        "    -m ddtree_launch \\",
        "    --api-key-env SGLANG_API_KEY sglang.launch_server \\",
        "    --model-path /models/Qwen3.6-27B \\",
    ]
    assert "\n".join(exec_start) in keyed.unit_text
    assert "--api-key" not in keyed.argv
    assert "--api-key " not in keyed.unit_text and "${" not in keyed.unit_text
    assert "SGLANG_API_KEY='sk-never-shown'" in keyed.env_text.splitlines()
    assert "SGLANG_API_KEY='***'" in keyed.env_masked.splitlines()
    plain = render_service(cfg, None)
    assert plain.argv[:3] == (python, "-m", "sglang.launch_server")
    assert "ddtree_launch" not in plain.unit_text and "SGLANG_API_KEY" not in plain.env_text
    assert keyed.argv[5:] == plain.argv[2:]  # the server's arguments are the same


def test_unit_keeps_gpu_devices_reachable() -> None:
    text = render_service(compose_config(["host=ct129", "algo=dflash"]), None).unit_text
    directives = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line}
    assert not directives & {"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"}
    assert "Environment=" not in text  # values live in the 0600 env file only


@needs_analyze
def test_lint_reports_unknown_key_and_exposure_over_threshold() -> None:
    cfg = compose_config(["host=ct129", "algo=dflash"])
    rendered = render_service(cfg, None)
    broken = type(rendered)(
        **{
            **rendered.__dict__,
            "unit_text": rendered.unit_text.replace("[Service]\n", "[Service]\nBogusKey=1\n"),
        }
    )
    with pytest.raises(UnitLintFailed, match="BogusKey"):
        lint_unit(broken, 10.0).raise_if_failed()
    with pytest.raises(UnitLintFailed, match="exposure"):
        lint_unit(rendered, 1.0).raise_if_failed()


def test_secret_never_prints() -> None:
    secret = Secret("abc123")
    assert (str(secret), repr(secret), f"{secret}") == ("***", "Secret('***')", "***")
    assert secret.mask("key=abc123;") == "key=***;"


@pytest.mark.parametrize(
    ("value", "word"),
    [
        ("plain/path-1.0", "plain/path-1.0"),
        ("a b", '"a b"'),
        ("50%", '"50%%"'),
        ("$HOME", '"$$HOME"'),
        ('q"\\', '"q\\"\\\\"'),
    ],
)
def test_exec_word_quotes_for_systemd(value: str, word: str) -> None:
    assert exec_word(value) == word


def test_env_assignment_quotes() -> None:
    assert env_assignment("K", "a b$c") == "K='a b$c'"
    assert env_assignment("K", "it's") == 'K="it\'s"'


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "a\x1bb", "a\u2028b"])
def test_quoting_refuses_a_line_breaking_character(value: str) -> None:
    """Composition refuses these with a sentence first; the quoting refuses them again, so a
    value that bypassed composition still cannot add a line."""
    for quote in (exec_word, unit_value, lambda v: env_assignment("K", v)):
        with pytest.raises(ValueError, match="control character"):
            quote(value)


def test_systemd_templates_show_only_quoted_values() -> None:
    template = TEMPLATES.from_string("User={{ user }}")
    assert template.render(user=unit_value("50%")) == "User=50%%"
    with pytest.raises(TypeError, match="unquoted str"):
        template.render(user="root\nExecStartPre=/bin/true")


def test_program_path_is_plain_and_absolute() -> None:
    assert exec_command(["/v/bin/python", "-m", "x y"]) == '/v/bin/python \\\n    -m "x y"'
    for program in ("python", "-/v/bin/python", '/v"/bin/python', "/v$HOME/bin/python"):
        with pytest.raises(ValueError, match="plain absolute path"):
            exec_command([program])


def test_newline_in_service_user_writes_no_directive() -> None:
    """It used to render an ExecStartPre= line into [Service] (issue 43)."""
    with pytest.raises(ConfigError) as refused:
        compose_config(["host=ct200", "service.user='root\nExecStartPre=/bin/true'"])
    assert str(refused.value).startswith("service.user holds the control character U+000A")
    assert refused.value.exit_code == 2


def test_deterministic_inference_is_one_flag() -> None:
    base = ["host=ct200", "algo=dflash"]
    plain = render_service(compose_config(base), None).argv
    strict = render_service(compose_config([*base, "service.deterministic_inference=true"]), None)
    assert "--enable-deterministic-inference" not in plain
    assert [a for a in strict.argv if a not in plain] == ["--enable-deterministic-inference"]


def test_kv_pool_cap_is_one_flag_pair() -> None:
    base = ["host=ct200", "algo=dflash"]
    plain = render_service(compose_config(base), None).argv
    capped = render_service(compose_config([*base, "service.max_total_tokens=65536"]), None).argv
    assert "--max-total-tokens" not in plain
    assert [a for a in capped if a not in plain] == ["--max-total-tokens", "65536"]
