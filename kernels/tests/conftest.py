"""Fixtures shared by the kernels' tests: the extension's CPU double (cuda_double.py) and the
host bench script, loaded as the module it is run as."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from cuda_double import install
from torch.utils._python_dispatch import TorchDispatchMode

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_host.py"


@pytest.fixture(scope="session")
def bench() -> ModuleType:
    """benchmarks/bench_host.py (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("bench_host", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cuda_path_on_cpu(monkeypatch: pytest.MonkeyPatch, bench: ModuleType) -> TorchDispatchMode:
    """`ops` takes its CUDA path for CPU tensors, through the double; enter the returned
    counter (bench_host.py's `Dispatched`) around the work to list its dispatched calls."""
    install(monkeypatch)
    return bench.Dispatched()
