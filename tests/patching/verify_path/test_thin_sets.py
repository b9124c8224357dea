"""The thin sets: their DDTREE logic comes from ddtree_kernels.sglang (docs/releases.md, "Where
DDTree's logic lives").

On CPU against each release's real patched SGLang (the check `ddtree_api_refusal` of its checks
script: v0511/checks.py for the worker-v1 releases, `worker_v2_checks.api_refusal_results` for
the others): the patched SGLang refuses at start, in one sentence, a ddtree_kernels.sglang whose
API version it was not written for (or none), and DFLASH needs no ddtree_kernels at all. The
shared logic itself is tested once, in kernels/tests/test_sglang.py; each release's own
verify-path tests hold its thin set to the same promises as before it was thin.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

WORKER_V1 = ("0.5.11", "0.5.12", "0.5.13")  # they share v0511/checks.py
WORKER_V2 = tuple(f"0.5.{minor}" for minor in range(14, 24))
HERE = Path(__file__).parent


@pytest.fixture(scope="module", params=WORKER_V1 + WORKER_V2)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def checks_script(checks_script: Path, release: str) -> Path:
    """The worker-v1 releases' shared script; the conftest's for the others."""
    return HERE / "v0511" / "checks.py" if release in WORKER_V1 else checks_script


def _one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text[:-1]


def test_patched_sglang_refuses_another_api_version_at_start(
    release: str, check: Callable[[str], dict]
) -> None:
    got = check("ddtree_api_refusal")
    assert got["wanted"] == got["module"] and got["loads"]
    newer = got["newer"]
    assert f"API {got['wanted']}" in newer and f"provides API {got['wanted'] + 1}" in newer
    assert "action=build-kernels" in newer and _one_sentence(newer), newer
    assert got["worker_newer"] == {"error": f"RuntimeError: {newer}"}
    if release in WORKER_V1:  # their DDTREE server arguments resolve through the module
        assert got["args_newer"] == newer
    # Kernels without the module (or none at all) fail the import in the set's own loader: one
    # sentence naming the module and the way to install it.
    missing = got["missing"]
    assert "needs the ddtree_kernels package with ddtree_kernels.sglang" in missing
    assert "action=build-kernels" in missing and _one_sentence(missing), missing


def test_dflash_runs_without_ddtree_kernels(release: str, check: Callable[[str], dict]) -> None:
    got = check("ddtree_api_refusal")["dflash_without_kernels"]
    assert got["imports"] and got["tree_mask"] is False and got["block"] == 16
    assert "needs the ddtree_kernels package" in got["ddtree_loader"]
    if release in WORKER_V1:
        # A worker that cannot import on CPU is read instead: every name it takes from the
        # set's modules is there without the kernels, and it imports no kernels itself.
        assert got["worker_missing_names"] == [] and got["worker_imports_kernels"] == []
