"""Every config group composes through Hydra's compose API into a typed DeployConfig."""

from __future__ import annotations

import pytest
from patching.trees import RELEASE_OPTIONS
from staging import sglang_option

from ddtree_deploy.config import Algo, DeployConfig, Transport, TreeMode, compose_config
from ddtree_deploy.config.rules import max_tree_budget
from ddtree_deploy.errors import ConfigError

HOSTS = ("local", "ct129", "ct200")
ALGOS = ("dflash", "ddtree", "ddtree_shadow")


def _compose(*overrides: str) -> DeployConfig:
    return compose_config(list(overrides))


def test_compose_default_is_local_staging_host_with_ddtree() -> None:
    cfg = _compose()
    assert cfg.host.name == "local"
    assert cfg.host.transport is Transport.local
    assert cfg.host.staging and not cfg.host.systemd
    assert cfg.gpu.name == "none"
    assert cfg.algo.name is Algo.DDTREE
    assert cfg.action == "plan"


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("algo", ALGOS)
def test_compose_every_host_and_algo(host: str, algo: str) -> None:
    overrides = [f"host={host}", f"algo={algo}"]
    if host != "local" and algo == "ddtree":  # CT hosts serve the hybrid Qwen3.6-27B
        overrides.append("algo.allow_hybrid_unsafe=true")
    cfg = _compose(*overrides)
    assert cfg.host.name == host
    assert cfg.algo.block_size == cfg.model.draft_block_size == 16
    assert cfg.algo.name is (Algo.DFLASH if algo == "dflash" else Algo.DDTREE)


@pytest.mark.parametrize(
    ("host", "cuda"),
    [("ct129", "13.0"), ("ct200", "12.8")],
)
def test_compose_ct_hosts_pull_in_their_gpu_abi_and_model(host: str, cuda: str) -> None:
    cfg = _compose(f"host={host}", "algo=ddtree_shadow")
    assert (cfg.abi.torch, cfg.abi.cuda, cfg.abi.python) == ("2.11.0", cuda, "3.12")
    assert cfg.gpu.arch == "sm_120" and cfg.gpu.memory_gb == 96
    assert cfg.host.gpu_count == 8 and list(cfg.host.gpu_ids) == list(range(8))
    assert cfg.model.name == "qwen36_27b" and cfg.model.hybrid
    assert cfg.sglang.version == "0.5.11"


def test_compose_group_override_replaces_host_default() -> None:
    cfg = _compose("host=ct200", "algo=ddtree_shadow", "gpu=h200", "sglang=v0_5_23")
    assert (cfg.gpu.arch, cfg.gpu.memory_gb) == ("sm_90", 141)
    assert cfg.sglang.version == "0.5.23"
    assert any(r.startswith("transformers==5.19") for r in cfg.sglang.staging_requirements)


def test_compose_shadow_algo_is_the_chain() -> None:
    cfg = _compose("algo=ddtree_shadow")
    assert cfg.algo.mode is TreeMode.shadow_linear
    assert (cfg.algo.topk, cfg.algo.budget) == (1, cfg.algo.block_size - 1)


def test_compose_pure_attention_model_allows_tree_mode() -> None:
    cfg = _compose("host=ct200", "model=qwen3_8b", "algo=ddtree")
    assert not cfg.model.hybrid and cfg.algo.mode is TreeMode.tree


def test_compose_local_paths_follow_ddtree_deploy_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_DEPLOY_HOME", "/srv/ddt")
    cfg = _compose("sglang=v0_5_23")
    assert cfg.host.sglang_venv == "/srv/ddt/local/sglang-0.5.23"
    assert cfg.host.state_dir == "/srv/ddt/local/state"


@pytest.mark.parametrize(
    ("host", "algo", "version"),
    [("local", "ddtree", "0.5.17"), ("ct200", "ddtree_shadow", "0.5.15.post1")],
)
def test_compose_version_alone_takes_that_release_s_option(
    host: str, algo: str, version: str
) -> None:
    """`sglang.version=X` without `sglang=` brings X's own pins and traits, not those of the
    host's default release (0.5.11's once made 0.5.17's hybrid tree pass as proven)."""
    cfg = compose_config([f"host={host}", f"algo={algo}", f"sglang.version={version}"])
    named = [f"host={host}", f"algo={algo}", f"sglang={sglang_option(version)}"]
    assert cfg.sglang == compose_config([*named, f"sglang.version={version}"]).sglang
    assert cfg.sglang.version == version
    assert cfg.sglang != compose_config([f"host={host}", f"algo={algo}"]).sglang


def test_compose_offers_an_sglang_option_for_each_release_with_a_set() -> None:
    with pytest.raises(ConfigError) as err:
        compose_config(["sglang=v0_5_24"])
    options = ", ".join(RELEASE_OPTIONS)
    assert str(err.value) == f"Unknown sglang 'v0_5_24'; choose one of: {options}."


@pytest.mark.parametrize("budget", [31, 63])
@pytest.mark.parametrize("sglang", RELEASE_OPTIONS)
def test_compose_takes_wide_tree_budgets_on_a_release_that_verifies_them(
    sglang: str, budget: int
) -> None:
    cfg = compose_config(
        [f"sglang={sglang}", "algo=ddtree", f"algo.budget={budget}", "algo.topk=8"]
    )
    assert (cfg.algo.budget, max_tree_budget(cfg)) == (budget, 63)


def test_compose_a_release_without_a_wider_verify_keeps_the_block_limit() -> None:
    """Every release with a set widens the verify now; one that does not declares no limit."""
    cfg = compose_config(["sglang=v0_5_23", "sglang.ddtree_max_budget=null"])
    assert cfg.sglang.ddtree_max_budget is None
    assert max_tree_budget(cfg) == cfg.algo.block_size - 1 == 15
