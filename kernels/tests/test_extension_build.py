"""The CUDA extension compiles here, with no GPU, and registers the schemas its CPU double serves
(cuda_double.py reads them from csrc/ops.cpp): a C++ error, or an op whose implementation does not
match its schema (torch refuses that registration at import), shows in CI instead of in the GPU
lab's first minutes. What the kernels compute is test_cuda_ops.py's, on the GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cuda_double import OPS_CPP, extension_schemas

KERNELS = Path(__file__).resolve().parents[1]
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))

# Run in a fresh interpreter: this one has the double's `ddtree` library registered.
_SCHEMAS = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import ddtree_kernels._C
schemas = [s for s in torch._C._jit_get_all_schemas() if s.name.startswith("ddtree::")]
print(json.dumps({s.name.removeprefix("ddtree::"): str(s) for s in schemas}))
"""


@pytest.mark.skipif(
    not (CUDA_HOME / "bin" / "nvcc").exists() or torch.version.cuda is None,
    reason="needs nvcc and a CUDA build of torch to compile the extension",
)
def test_the_extension_compiles_and_registers_the_schemas_the_double_serves(
    tmp_path: Path,
) -> None:
    source = tmp_path / "kernels"
    skip = shutil.ignore_patterns("tests", "benchmarks", "build", "__pycache__", "*.so")
    shutil.copytree(KERNELS, source, ignore=skip)
    env = {**os.environ, "DDTREE_KERNELS_BUILD_CUDA": "1", "CUDA_HOME": str(CUDA_HOME),
           "TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "2"}  # fmt: skip
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=source, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    loaded = subprocess.run(
        [sys.executable, "-c", _SCHEMAS, str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[:3000]  # torch says why first
    registered = json.loads(loaded.stdout.splitlines()[-1])
    served = extension_schemas(OPS_CPP.read_text())
    assert registered == {name: f"ddtree::{schema}" for name, schema in served.items()}
