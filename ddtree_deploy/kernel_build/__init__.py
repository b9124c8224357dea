"""The kernels builder: ddtree-kernels built for a host's exact ABI, cached, installed, verified.

Owns the ABI key, the control machine's wheel cache, the build on the host, the install into the
SGLang venv, the smoke test against the reference, and the `kernels` entry of state.json. Leaves
the order of steps to `rollout` and the restart on a changed key to the service lifecycle.

Step API (for the deploy pipeline):

    step = KernelsStep.from_config(cfg)
    plan = step.check(host)      # KernelsPlan: ok | would_change | unknown, reason, key, source
    result = step.apply(host)    # KernelsResult: ok | changed; raises KernelBuildError on failure

Both accept the `HostFacts` already probed (`facts=`) to save a round trip. After a `changed`
apply, state.json holds `kernels: {key, digest, variant, python_sha256, wheel, wheel_sha256,
record_sha256}`: `digest` names the compiled build and `python_sha256` the package Python in
it; a change to either is a new install, and SGLang must restart to import it.

The statuses are the shared ones of `ddtree_deploy.steps`; the pipeline wraps the richer plan
and result into its `StepPlan`/`StepResult` rows.
"""

from ddtree_deploy.kernel_build.errors import (
    KernelBuildError,
    KernelBuildFailed,
    KernelSmokeFailed,
    KernelSourceMissing,
)
from ddtree_deploy.kernel_build.key import KernelKey, build_sha256, cuda_arch_list
from ddtree_deploy.kernel_build.smoke import SmokeReport
from ddtree_deploy.kernel_build.step import (
    KernelsPlan,
    KernelsResult,
    KernelsStep,
    WheelSource,
)
from ddtree_deploy.steps import PlanStatus, ResultStatus

__all__ = [
    "KernelBuildError",
    "KernelBuildFailed",
    "KernelKey",
    "KernelSmokeFailed",
    "KernelSourceMissing",
    "KernelsPlan",
    "KernelsResult",
    "KernelsStep",
    "PlanStatus",
    "ResultStatus",
    "SmokeReport",
    "WheelSource",
    "build_sha256",
    "cuda_arch_list",
]
