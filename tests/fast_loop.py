"""Which tests make the fast loop (`pytest -m fast`, `scripts/test --fast`), read from their code.

A test is in the fast loop unless it needs a heavy part: a hostlab host (sshd or a systemd-nspawn
container), a staging SGLang venv (or the stand-in venv made from one), a released SGLang wheel
or the tree unpacked from it, the staging venv build itself, or nvcc (a `skipif` that names it:
the test compiles the CUDA extension). Its markers say so (`sshd`, `nspawn`, `clone`, or `slow`
with its reason), or its code does: the test function and every fixture it requests, directly
or through other fixtures, are followed through the names their code uses (nested functions
included) into every function, class and module of tests/ and kernels/tests/ they name;
reaching one of `HEAVY_ENTRY_POINTS`, or writing one of `HEAVY_CLI_ARGUMENTS`, makes the test
heavy. No list of tests is kept: a new test that calls `require_staging_venv` leaves the fast
loop by itself.

`scripts/test --fast` also hides the staging venvs and makes hostlab and staging refusals fail,
not skip, so a test this reading misses fails loudly there instead of slowing the loop.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hostlab import boot_container, ensure_rootfs, start_sshd_host
from staging import require_staging_venv, staging_site_dirs
from standin.lab import source_venv

from ddtree_deploy.hosts.staging import prepare_staging_venv
from ddtree_deploy.patching.wheels import cached_wheel, fetch_wheel

# Where each heavy part is first touched; everything that needs one goes through these.
HEAVY_ENTRY_POINTS: frozenset[object] = frozenset(
    {
        start_sshd_host,  # sshd in a network namespace
        boot_container,  # a systemd-nspawn host
        ensure_rootfs,  # the containers' Debian root
        require_staging_venv,  # a prepared SGLang venv
        staging_site_dirs,  # runs a staging venv's Python
        source_venv,  # the stand-in's venv, made from a staging venv
        fetch_wheel,  # a released SGLang wheel (download or cache)
        cached_wheel,
        prepare_staging_venv,  # builds a staging venv
    }
)
# CLI arguments, written in a test, that reach a heavy part through the action table (which the
# name-following below does not enter): `port` reads a released SGLang wheel, `prepare` builds a
# staging venv.
HEAVY_CLI_ARGUMENTS = frozenset({"action=port", "action=prepare"})
HEAVY_MARKERS = ("sshd", "nspawn", "clone", "slow")
_OUR_CODE = tuple(
    str(Path(__file__).resolve().parents[1] / folder) + "/" for folder in ("tests", "kernels/tests")
)


def _ours(obj: object) -> bool:
    """Whether `obj` is defined in the test code (the only code this reading follows)."""
    try:
        source = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return source is not None and source.startswith(_OUR_CODE)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and every function, lambda and comprehension defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


class HeavyReach:
    """Memoised answer to "does this callable reach a heavy part?" across one collection."""

    def __init__(self) -> None:
        self._known: dict[object, bool] = {}

    def function(self, func: Callable[..., object]) -> bool:
        func = inspect.unwrap(func)
        if func in HEAVY_ENTRY_POINTS:
            return True
        code = getattr(func, "__code__", None)
        if code is None or not _ours(func):
            return False
        if code in self._known:
            return self._known[code]
        self._known[code] = False  # a cycle reaches nothing new
        codes = list(_codes(code))
        names = {name for c in codes for name in c.co_names}
        namespace = getattr(func, "__globals__", {})
        consts = {const for c in codes for const in c.co_consts if isinstance(const, str)}
        found = bool(consts & HEAVY_CLI_ARGUMENTS) or any(
            self._value(namespace.get(name), names) for name in names
        )
        self._known[code] = found
        return found

    def _value(self, value: object, names: set[str]) -> bool:
        if value is None:
            return False
        if inspect.ismodule(value):  # `trees.wheel_path(...)`: the attribute names are in names
            return _ours(value) and any(self._value(getattr(value, n, None), set()) for n in names)
        if inspect.isclass(value):
            methods = (inspect.unwrap(getattr(m, "__func__", m)) for m in vars(value).values())
            return _ours(value) and any(self.function(m) for m in methods if inspect.isfunction(m))
        if inspect.isfunction(inspect.unwrap(value)):  # type: ignore[arg-type]
            return self.function(value)  # type: ignore[arg-type]
        return False


def _needs_nvcc(item: pytest.Item) -> bool:
    """Whether a `skipif` of the test says it needs nvcc: such a test compiles the CUDA extension,
    minutes of nvcc on two cores (kernels/tests/test_extension_build.py took over ten)."""
    return any("nvcc" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))


def heavy_reason(item: pytest.Item, reach: HeavyReach) -> str | None:
    """Why `item` is not in the fast loop, or None when it is."""
    for marker in HEAVY_MARKERS:
        if item.get_closest_marker(marker) is not None:
            return f"marked {marker}"
    if _needs_nvcc(item):
        return "compiles CUDA code"
    if not isinstance(item, pytest.Function):
        return "not a plain test function"
    if reach.function(item.function):
        return "its code reaches a heavy part"
    # pytest keeps the fixture closure's definitions on the item (no public accessor).
    for name, definitions in item._fixtureinfo.name2fixturedefs.items():
        if any(reach.function(d.func) for d in definitions):
            return f"fixture {name} reaches a heavy part"
    return None
