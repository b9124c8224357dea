"""The kernels builder: ddtree-kernels built for a host's exact ABI, cached, installed, verified.

Owns the ABI key, the control machine's wheel cache, the build on the host, the install into the
SGLang venv, the smoke test against the reference, and the `kernels` entry of state.json. Leaves
the order of steps to `rollout` and the restart on a changed key to the service lifecycle.

Step API (for the deploy pipeline):

    step = KernelsStep.from_config(cfg)
    plan = step.check(host)      # KernelsPlan: ok | would_change | unknown, reason, key, source
    result = step.apply(host)    # KernelsResult: ok | changed; raises KernelBuildError on failure

Both accept the `HostFacts` already probed (`facts=`) to save a round trip. After a `changed`
apply, state.json holds `kernels: {key, digest, variant, wheel, wheel_sha256, record_sha256}`:
compare `digest` across generations to decide whether SGLang must restart.

`rollout.steps.Step` wants `StepPlan`/`StepResult`; the statuses here carry the same values, so
the pipeline's adapter is `StepPlan(rollout.PlanStatus(plan.status.value), plan.reason)` and
`StepResult(rollout.ResultStatus(result.status.value), result.reason)` (kernel_build may not
import rollout: dependencies point from rollout to the rooms).
"""

from ddtree_deploy.kernel_build.errors import (
    KernelBuildError,
    KernelBuildFailed,
    KernelSmokeFailed,
    KernelSourceMissing,
)
from ddtree_deploy.kernel_build.key import KernelKey, cuda_arch_list, source_sha256
from ddtree_deploy.kernel_build.smoke import SmokeReport
from ddtree_deploy.kernel_build.step import (
    KernelsPlan,
    KernelsResult,
    KernelsStep,
    PlanStatus,
    ResultStatus,
    WheelSource,
)

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
    "cuda_arch_list",
    "source_sha256",
]
