"""service.extra_args cannot replace a server argument the tool writes from a setting.

ExecStart appends service.extra_args after the tool's own arguments and SGLang's parser keeps
the last of a repeated flag, so `--port 31000` there would move the server off the port the
gates ask, `--speculative-algorithm EAGLE` swap the algorithm they judged. The list of such
flags (config/rules.py's TOOL_FLAGS) is kept complete against what render writes."""

from __future__ import annotations

import pytest

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.rules import TOOL_FLAGS
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.service.render import server_argv

# Configs that between them make render write every flag it can.
ARGV_CONFIGS = [
    ["algo=dflash"],
    ["algo=ddtree", "service.deterministic_inference=true", "service.max_total_tokens=4096"],
    ["algo=ddtree_shadow"],
    [
        "host=h200_lab",
        "service=lab",
        "model=lab_hybrid",
        "algo=ddtree",
        "algo.allow_hybrid_unsafe=true",
    ],
]


def _written_flags(overrides: list[str]) -> list[str]:
    """The `--flags` the tool writes into the server's argv: after the launch module (the
    launcher's own are not SGLang's) and before the config's own extra_args."""
    cfg = compose_config(overrides)
    argv = server_argv(cfg, api_key=False)
    written = argv[
        argv.index(cfg.service.launch_module) + 1 : len(argv) - len(cfg.service.extra_args)
    ]
    return [a for a in written if a.startswith("--")]


@pytest.mark.parametrize("overrides", ARGV_CONFIGS, ids=lambda o: o[-1])
def test_every_flag_render_writes_is_refused_in_extra_args(overrides: list[str]) -> None:
    flags = _written_flags(overrides)
    assert "--port" in flags and "--speculative-algorithm" in flags
    for flag in flags:
        with pytest.raises(ConfigError, match=f"service.extra_args holds {flag}, a server "):
            compose_config([*overrides, f"service.extra_args=[{flag},1]"])


def test_the_sentence_names_the_setting_to_use_instead() -> None:
    with pytest.raises(ConfigError) as refused:
        compose_config(["service.extra_args=[--log-level,info,--port,31000]"])
    assert str(refused.value) == (
        "service.extra_args holds --port, a server argument the tool writes from service.port; "
        "set service.port instead (SGLang keeps the last one given, so it would replace the "
        "setting the gates judge)."
    )


@pytest.mark.parametrize(
    ("extra", "owner"),
    [("'--speculative-algorithm=EAGLE'", "algo"),  # the = form
     ("--mem-fraction,0.5", "service.mem_fraction_static"),  # SGLang's parser expands a prefix
     ("--tensor-parallel-size,2", "service.tp_size"),  # SGLang's alias of --tp-size
     ("--disable-radix-cache", "sglang.hybrid_speculative_args")],  # a release's hybrid flag
)  # fmt: skip
def test_aliases_abbreviations_and_the_equals_form_are_refused(extra: str, owner: str) -> None:
    overrides = [
        "host=h200_lab",
        "service=lab",
        "model=lab_hybrid",
        f"service.extra_args=[{extra}]",
    ]
    with pytest.raises(ConfigError, match=f"the tool writes from {owner};"):
        compose_config(overrides)


def test_flags_the_tool_does_not_write_pass() -> None:
    """Other server arguments are what extra_args is for; a prefix shared by two written flags
    (`--speculative-d`) is not ours to expand: SGLang refuses it at start as ambiguous."""
    cfg = compose_config(
        ["service.extra_args=[--log-level,info,--speculative-d,x,--enable-metrics]"]
    )
    assert cfg.service.extra_args == [
        "--log-level",
        "info",
        "--speculative-d",
        "x",
        "--enable-metrics",
    ]
    assert all(flag.startswith("--") for flag in TOOL_FLAGS)


def test_a_releases_hybrid_flags_are_free_on_a_dense_target() -> None:
    """render writes sglang.hybrid_speculative_args only for a hybrid target; a dense one's
    operator may pass `--disable-radix-cache` themselves."""
    cfg = compose_config(["service.extra_args=[--disable-radix-cache]"])
    assert cfg.service.extra_args == ["--disable-radix-cache"]
