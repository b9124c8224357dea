"""The first compiler error of a failed `pip wheel` log, on recorded output."""

from __future__ import annotations

from ddtree_deploy.kernel_build.buildlog import first_error

# Recorded from `pip wheel -v` of a CUDAExtension with one broken .cu file (nvcc 13.0, ninja).
NVCC_LOG = """\
  running build_ext
  [1/1] /usr/local/cuda-13.0/bin/nvcc -c /tmp/src/csrc/broken.cu -o broken.o -O3
  FAILED: [code=2] /tmp/build/temp.linux-x86_64-cpython-311/csrc/broken.o
  /tmp/src/csrc/broken.cu(1): error: identifier "undeclared_name" is undefined
    int broken() { return undeclared_name; }
                          ^
  /tmp/src/csrc/broken.cu(2): error: expected a ";"
  2 errors detected in the compilation of "/tmp/src/csrc/broken.cu".
  ninja: build stopped: subcommand failed.
  error: command '/usr/bin/ninja' failed with exit code 1
  error: subprocess-exited-with-error
"""

GCC_LOG = """\
  c++ -MMD -c /tmp/src/csrc/ops.cpp -o ops.o
  /tmp/src/csrc/ops.cpp: In function 'void f()':
  /tmp/src/csrc/ops.cpp:12:5: error: 'undeclared' was not declared in this scope
  error: command '/usr/bin/c++' failed with exit code 1
"""


def test_first_error_names_the_nvcc_diagnostic() -> None:
    assert first_error(NVCC_LOG) == (
        '/tmp/src/csrc/broken.cu(1): error: identifier "undeclared_name" is undefined'
    )


def test_first_error_names_the_gcc_diagnostic() -> None:
    assert first_error(GCC_LOG) == (
        "/tmp/src/csrc/ops.cpp:12:5: error: 'undeclared' was not declared in this scope"
    )


def test_first_error_falls_back_to_any_error_line() -> None:
    log = "running bdist_wheel\nerror: invalid command 'bdist_wheel'\nmore\n"
    assert first_error(log) == "error: invalid command 'bdist_wheel'"


def test_first_error_falls_back_to_the_last_line() -> None:
    assert first_error("one\nModuleNotFoundError: No module named 'torch'\n\n") == (
        "ModuleNotFoundError: No module named 'torch'"
    )
