"""The thin sets on the v2 design (the releases of `release` below): their DDTREE logic comes
from ddtree_kernels.sglang (THIN-SETS.md).

On CPU against each real patched release (the check `ddtree_api_refusal` of checks_0514.py, and
of ../v0523/checks_0523.py from 0.5.19; both `worker_v2_checks.api_refusal_results`): the
patched SGLang refuses at start, in one sentence, a ddtree_kernels.sglang whose API version it
was not written for (or none), and DFLASH needs no ddtree_kernels at all. The shared logic
itself is tested once, in kernels/tests/test_sglang.py; the shared verify-path tests hold the
thin set to the same promises as every other worker-v2 set.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture(
    scope="module",
    params=(
        "0.5.14",
        "0.5.15",
        "0.5.16",
        "0.5.17",
        "0.5.18",
        "0.5.19",
        "0.5.20",
        "0.5.21",
        "0.5.22",
        "0.5.23",
    ),
)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text[:-1]


def test_patched_sglang_refuses_another_api_version_at_start(check: Callable[[str], dict]) -> None:
    got = check("ddtree_api_refusal")
    assert got["wanted"] == got["module"] and got["loads"]
    newer = got["newer"]
    assert f"API {got['wanted']}" in newer and f"provides API {got['wanted'] + 1}" in newer
    assert "action=build-kernels" in newer and _one_sentence(newer), newer
    assert got["worker_newer"] == {"error": f"RuntimeError: {newer}"}
    # Kernels without the module (or none at all) fail the import in the set's own loader: one
    # sentence naming the module and the way to install it.
    missing = got["missing"]
    assert "needs the ddtree_kernels package with ddtree_kernels.sglang" in missing
    assert "action=build-kernels" in missing and _one_sentence(missing), missing


def test_dflash_runs_without_ddtree_kernels(check: Callable[[str], dict]) -> None:
    got = check("ddtree_api_refusal")["dflash_without_kernels"]
    assert got["imports"] and got["tree_mask"] is False and got["block"] == 16
    assert "needs the ddtree_kernels package" in got["ddtree_loader"]
