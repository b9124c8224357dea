"""Each bad config value fails with one sentence naming the key, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from patching.trees import RELEASE_OPTIONS

from ddtree_deploy.cli import main
from ddtree_deploy.config import compose_config
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.service.secret import load_api_key

CASES = [
    pytest.param(
        ["algo=nope"],
        "Unknown algo 'nope'; choose one of: ddtree, ddtree_shadow, dflash.",
        id="unknown-algo",
    ),
    pytest.param(
        ["host=ct300"],
        "Unknown host 'ct300'; choose one of: ct129, ct200, h200_lab, local.",
        id="unknown-host",
    ),
    pytest.param(
        ["gpu=a100"],
        "Unknown gpu 'a100'; choose one of: h200, none, rtx_pro_6000_blackwell.",
        id="unknown-gpu",
    ),
    pytest.param(
        ["algo.budget=abc"],
        "Config key algo.budget has an invalid value: Value 'abc' of type 'str' could not be converted to Integer.",
        id="wrong-type",
    ),
    pytest.param(
        ["algo.mode=wide"],
        "Config key algo.mode has an invalid value: Invalid value 'wide', expected one of [tree, shadow_linear].",
        id="wrong-enum",
    ),
    pytest.param(
        ["algo.bugdet=3"],
        "Config key algo.bugdet does not exist; did you mean algo.budget?",
        id="unknown-key",
    ),
    pytest.param(
        ["algo.budget=0"],
        "algo.budget=0 is out of range: give a number at least 1.",
        id="budget-low",
    ),
    pytest.param(
        ["algo.budget=64"],
        "algo.budget=64 is out of range: SGLang 0.5.11's patch set verifies between 1 and 63 tree nodes (sglang.ddtree_max_budget; the verify width becomes budget + 1).",
        id="budget-above-wide-release",
    ),
    *(
        pytest.param(
            [f"sglang={option}", "algo.budget=64"],
            f"algo.budget=64 is out of range: SGLang {option[1:].replace('_', '.')}'s patch set verifies between 1 and 63 tree nodes (sglang.ddtree_max_budget; the verify width becomes budget + 1).",
            id=f"budget-above-wide-{option}",
        )
        for option in RELEASE_OPTIONS
    ),
    # No release with a set keeps the block limit now; a release that declares no wider verify does.
    pytest.param(
        ["sglang=v0_5_23", "sglang.ddtree_max_budget=null", "algo.budget=16"],
        "algo.budget=16 is out of range: SGLang 0.5.23's patch set verifies between 1 and block_size - 1 = 15 tree nodes (the verify width stays the block size).",
        id="budget-above-block-release",
    ),
    pytest.param(
        ["sglang=v0_5_23", "sglang.ddtree_max_budget=null", "algo.budget=63"],
        "algo.budget=63 is out of range: SGLang 0.5.23's patch set verifies between 1 and block_size - 1 = 15 tree nodes (the verify width stays the block size).",
        id="budget-wide-on-block-release",
    ),
    pytest.param(
        ["algo=ddtree_shadow", "algo.budget=63"],
        "algo.mode=shadow_linear needs the chain: algo.topk=1 and algo.budget=15 (got topk=1, budget=63); use algo=ddtree_shadow.",
        id="shadow-wide",
    ),
    pytest.param(
        ["algo.topk=0"],
        "algo.topk=0 is out of range: give a number at least 1.",
        id="topk-low",
    ),
    pytest.param(
        ["algo.budget=63", "algo.topk=17"],
        "algo.topk=17 is out of range: it must be between 1 and 16 (the DDTree tree kernel takes at most 16 candidates per position; the server would refuse it at start).",
        id="topk-above-kernel",
    ),
    pytest.param(
        ["algo.budget=6", "algo.topk=7"],
        "algo.topk=7 is out of range: it must be between 1 and algo.budget = 6.",
        id="topk-above-budget",
    ),
    pytest.param(
        ["algo.block_size=8"],
        "algo.block_size=8 does not match the draft model's block size 16 (model.draft_block_size of qwen3_8b); set algo.block_size=16.",
        id="block-size",
    ),
    pytest.param(
        ["host=ct200", "sglang=v0_5_12", "algo=ddtree"],
        "algo.mode=tree on the hybrid target qwen36_27b needs algo.allow_hybrid_unsafe=true on SGLang 0.5.12: the GPU lab has not proven this release's tree path through recurrent layers (it has for 0.5.11 and 0.5.14: DFLASH's tokens exactly, with sibling branches accepted); use algo=ddtree_shadow for the safe chain mode.",
        id="hybrid-tree-unproven-release",
    ),
    pytest.param(
        ["host=ct200", "sglang.version=0.5.17", "algo=ddtree"],
        "algo.mode=tree on the hybrid target qwen36_27b needs algo.allow_hybrid_unsafe=true on SGLang 0.5.17: the GPU lab has not proven this release's tree path through recurrent layers (it has for 0.5.11 and 0.5.14: DFLASH's tokens exactly, with sibling branches accepted); use algo=ddtree_shadow for the safe chain mode.",
        id="hybrid-tree-unproven-release-by-version",
    ),
    pytest.param(
        ["sglang=v0_5_11", "sglang.version=0.5.17"],
        "sglang.version=0.5.17 does not match sglang=v0_5_11, which holds another release's pins and traits; drop sglang= or name sglang=v0_5_17.",
        id="version-of-another-option",
    ),
    pytest.param(
        ["algo=ddtree_shadow", "algo.topk=2"],
        "algo.mode=shadow_linear needs the chain: algo.topk=1 and algo.budget=15 (got topk=2, budget=15); use algo=ddtree_shadow.",
        id="shadow-not-chain",
    ),
    pytest.param(
        ["abi.torch=2.11"],
        "abi.torch='2.11' is malformed: give the public torch version as X.Y.Z (e.g. 2.11.0), without a +cuXXX suffix (that is abi.cuda).",
        id="abi-torch",
    ),
    pytest.param(
        ["abi.torch=2.11.0+cu130"],
        "abi.torch='2.11.0+cu130' is malformed: give the public torch version as X.Y.Z (e.g. 2.11.0), without a +cuXXX suffix (that is abi.cuda).",
        id="abi-torch-local",
    ),
    pytest.param(
        ["abi.cuda=cu130"],
        "abi.cuda='cu130' is malformed: give torch's CUDA version as X.Y (e.g. 12.8), or null for a CPU build.",
        id="abi-cuda",
    ),
    pytest.param(
        ["abi.python=py312"],
        "abi.python='py312' is malformed: give the Python version as 3.Y.",
        id="abi-python",
    ),
    pytest.param(
        ["host=ct129", "algo=dflash", "gpu.arch=blackwell"],
        "gpu.arch='blackwell' is malformed: give the CUDA arch as sm_XY (e.g. sm_120).",
        id="gpu-arch",
    ),
    pytest.param(
        ["host=ct129", "algo=dflash", "host.address=null"],
        "host.address is missing for host ct129 (transport ssh); set host.address=<name or IP>.",
        id="ssh-address",
    ),
    pytest.param(
        ["host=ct129", "algo=dflash", "host.gpu_ids=[0,8]"],
        "host.gpu_ids=[0, 8] names GPUs outside 0..7 (host.gpu_count=8).",
        id="gpu-ids",
    ),
    pytest.param(
        ["service.max_total_tokens=0"],
        "service.max_total_tokens=0 is out of range: give a number at least 1 (tokens; null for no cap).",
        id="kv-cap-zero",
    ),
    pytest.param(
        ["algo=ddtree", "service.extra_args=[--log-level,info,--attention-backend,fa3]"],
        "service.extra_args sets --attention-backend fa3, but DDTREE tree mode needs a backend that reads the tree mask (flashinfer or triton); SGLang would refuse it at start.",
        id="tree-backend",
    ),
    pytest.param(
        ["service.extra_args=[--log-level,info,'--api-key=sk-visible']"],
        "service.extra_args holds --api-key, which would put a key in the unit file and on the server's command line; give the API key through service.api_key_env or service.api_key_file.",
        id="key-in-extra-args",
    ),
    pytest.param(["action=explode"], "action='explode' is unknown; choose one of: ", id="action"),
    pytest.param(
        ["sglang.version=latest"],
        "sglang.version='latest' is not a version (e.g. 0.5.11).",
        id="sglang-version",
    ),
    pytest.param(
        ["validation.min_speedup=0"],
        "validation.min_speedup=0.0 is out of range: give a number above 0 (tree tokens/s over linear DFlash's).",
        id="min-speedup",
    ),
    pytest.param(
        ["validation.min_pass_s=-1"],
        "validation.min_pass_s=-1.0 is out of range: give a number at least 0 (seconds).",
        id="min-pass-s",
    ),
    pytest.param(
        ["validation.tie_noise_factor=0.5"],
        "validation.tie_noise_factor=0.5 is out of range: give a number at least 1 (a tree is "
        "allowed at least linear DFlash's own worst gap).",
        id="tie-noise-factor",
    ),
    pytest.param(
        ["validation.max_tie_tolerance=0.1"],
        "validation.max_tie_tolerance=0.1 must be at least validation.tie_tolerance=0.5.",
        id="max-tie-tolerance",
    ),
    pytest.param(  # nan compares false with every bound: it used to switch the tree gate's token check off
        ["validation.tie_tolerance=nan"],
        "validation.tie_tolerance=nan is not a finite number; give a number at least 0 (nats; 0 asks every tree token to be the target's top-1).",
        id="tie-tolerance-nan",
    ),
    pytest.param(
        ["validation.tree.timeout_s=nan"],
        "validation.tree.timeout_s=nan is not a finite number; give a number above 0 (seconds).",
        id="gate-timeout-nan",
    ),
]


HOST_NAME_RULE = "cannot name the host's run folders and files: give 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit."
CASES += [
    pytest.param(["host.name=a/b"], f"host.name='a/b' {HOST_NAME_RULE}", id="host-name-slash"),
    pytest.param(
        ["host.name=" + "a" * 10_000],
        f"host.name={'a' * 40!r}... (10000 characters) {HOST_NAME_RULE}",
        id="host-name-long",
    ),
    pytest.param(["host.name=.."], f"host.name='..' {HOST_NAME_RULE}", id="host-name-dots"),
    pytest.param(
        ["fleet=ct", "fleet.name=a/b"],
        "fleet.name='a/b' cannot name the fleet's run folders and journal: give 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit.",
        id="fleet-name",
    ),
    pytest.param(
        ["host=ct200", "service.unit_name=a/b"],
        "service.unit_name='a/b' is not a systemd unit name: give 1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit.",
        id="unit-name",
    ),
    pytest.param(
        ["host=ct200", "service.user=ro ot"],
        "service.user='ro ot' is not a user name systemd's User= takes: give a name of letters, digits, '_' and '-' (not starting with a digit or '-'), or a UID.",
        id="service-user",
    ),
    pytest.param(
        ["host=ct200", "service.env_dir=etc"],
        "service.env_dir='etc' is not an absolute path; give the folder's full path.",
        id="env-dir-relative",
    ),
    pytest.param(
        ["host=ct200", "host.sglang_venv=/opt/" + "v" * 300],
        "host.sglang_venv='/opt/vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv'... (305 characters) is too long for a file system: at most 255 bytes a folder name and 4095 in all.",
        id="venv-too-long",
    ),
    pytest.param(
        ["host=ct200", "host.sglang_venv='/opt/$HOME'"],
        "host.sglang_venv='/opt/$HOME' holds '$', which systemd does not take in the program path of ExecStart=; give the venv a path without quotes, backslashes or $.",
        id="venv-dollar",
    ),
    pytest.param(
        ["service.unit_name=sglang.service"],
        "service.unit_name='sglang.service' ends in .service, which the unit's file name adds; give 'sglang'.",
        id="unit-name-suffix",
    ),
    pytest.param(
        ["host.state_dir=state"],
        "host.state_dir='state' is not an absolute path; give the folder's full path.",
        id="state-dir-relative",
    ),
    pytest.param(
        ["rollout.runs_dir=' '"],
        "rollout.runs_dir is empty; give the folder the run folders go in (default: runs).",
        id="runs-dir-empty",
    ),
    pytest.param(
        ["host.gpu_ids=[0]"],
        "host.gpu_ids=[0] names GPUs on a host with host.gpu_count=0; give the host's GPU count, or host.gpu_ids=[].",
        id="gpu-ids-without-gpus",
    ),
    pytest.param(
        ["service.environment={A:b}"],
        "Config key service.environment.A is not set yet and Hydra adds a key only when asked; give it as +service.environment.A=<value>.",
        id="dict-key-without-plus",
    ),
    pytest.param(
        ["tune.budgets=4"],
        "Config key tune.budgets takes a list; give it as tune.budgets=[a,b].",
        id="list-given-a-word",
    ),
    pytest.param(
        ["action=plan", "output=prometheus"],
        "output=prometheus is for action=status alone; give action=plan output=table or output=json.",
        id="prometheus-beside-plan",
    ),
    pytest.param(
        ["fleet=ct", "action=status", "output=prometheus"],
        "output=prometheus prints one host's metrics, not fleet ct's; name one host with host=, or give output=table.",
        id="prometheus-for-a-fleet",
    ),
    pytest.param(
        ["host=ct200", "watch.interval='1h;2'"],
        "watch.interval='1h;2' is not a systemd time span above 0; give one such as 1h, 30min or 1d.",
        id="watch-interval-not-a-span",
    ),
    pytest.param(
        ["host=ct200", "watch.interval=0"],
        "watch.interval='0' is not a systemd time span above 0; give one such as 1h, 30min or 1d.",
        id="watch-interval-zero",
    ),
    pytest.param(
        ["host=ct200", "watch.accuracy=1x"],
        "watch.accuracy='1x' is not a systemd time span above 0; give one such as 1min or 30s.",
        id="watch-accuracy-unit",
    ),
    pytest.param(
        ["host=ct200", "watch.textfile_dir=prom"],
        "watch.textfile_dir='prom' is not an absolute path; give the folder's full path.",
        id="watch-textfile-relative",
    ),
    pytest.param(
        ["model.name=${nowhere}"],
        "Config key model.name cannot be resolved (Interpolation key 'nowhere' not found); give a plain value or a ${...} that names a key of the config or a set environment variable.",
        id="interpolation-unresolved",
    ),
    pytest.param(
        ["deploy"],
        "'deploy' is not an override: give each setting as key=value, e.g. action=deploy.",
        id="bare-action-word",
    ),
    pytest.param(
        ["model.name='a\tb'"],
        "model.name holds the control character U+0009, which could add a line to a unit, an environment file or a command; give it on one line without control characters.",
        id="control-character",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), CASES)
def test_compose_refuses_bad_value_with_one_sentence(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        compose_config(overrides)
    text = str(caught.value)
    assert text.startswith(message)
    assert "\n" not in text
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("name", ["a/b", "a" * 10_000], ids=["slash", "long"])
def test_command_refuses_a_host_name_that_cannot_name_a_folder(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each used to end in a traceback where the run folder was made (`File name too long`)."""
    runs = tmp_path / "runs"
    assert main([f"host.name={name}", f"rollout.runs_dir={runs}"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: host.name=") and lines[0].endswith(HOST_NAME_RULE)
    assert len(lines[0]) < 300  # a long name is cut short
    assert not runs.exists()


def test_api_key_file_open_to_others_is_refused(tmp_path: Path) -> None:
    """The key reaches the host only in a 0600 file; a key file on this machine that its group
    or others can read is refused before anything runs, as ssh refuses such a private key."""
    key = tmp_path / "api-key"
    key.write_text("sk-test\n")
    key.chmod(0o640)
    cfg = compose_config(["host=ct200", f"service.api_key_file={key}"])
    with pytest.raises(ConfigError) as caught:
        load_api_key(cfg.service)
    assert str(caught.value) == (
        f"The API key file {key} (service.api_key_file) is open to its group or others "
        f"(mode 0640); make it private: chmod 600 {key}."
    )
    key.chmod(0o600)
    assert load_api_key(cfg.service).reveal() == "sk-test"


@pytest.mark.parametrize("span", ["1h", "90", "1h 30min", "1.5h", "4s", "2 weeks", "500ms"])
def test_watch_interval_takes_systemd_time_spans(span: str) -> None:
    """The forms systemd.time(7) gives for a time span pass as the timer's interval."""
    assert compose_config(["host=ct200", f"watch.interval='{span}'"]).watch.interval == span
