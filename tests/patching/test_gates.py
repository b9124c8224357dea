"""Which source lines are DFLASH gate sites, and which function encloses them."""

from __future__ import annotations

import textwrap
from pathlib import PurePosixPath

import pytest

from ddtree_deploy.patching.gates import GatePattern, find_gate_sites

_SOURCE = textwrap.dedent(
    '''
    """Module docstring mentions DFLASH but is no gate."""
    CHOICES = ("EAGLE", "DFLASH")


    class Input:
        kind = SpecInputType.DFLASH_VERIFY
        sync = SpecTpSyncSite.DFLASH_MEM

        def is_dflash(self):
            return self == SpeculativeAlgorithm.DFLASH

        async def run(self, algo):
            def inner():
                return algo.is_dflash_family() or is_dflash()
            return inner() and algo.name == "dflash"


    def outer(args):
        if args.algo == "DFLASH" or args.algo != "DFLASH":
            return SpeculativeAlgorithm.DFLASH.name
    '''
)


def _sites() -> dict[int, tuple[str, tuple[GatePattern, ...]]]:
    sites = find_gate_sites(PurePosixPath("sglang/x.py"), _SOURCE.encode())
    return {s.line: (s.function, s.patterns) for s in sites}


def test_gate_sites_match_each_pattern_once_per_line() -> None:
    lines = _SOURCE.splitlines()
    found = {lines[n - 1].strip(): patterns for n, (_, patterns) in _sites().items()}
    assert found == {
        'CHOICES = ("EAGLE", "DFLASH")': (GatePattern.dflash_literal,),
        "kind = SpecInputType.DFLASH_VERIFY": (GatePattern.spec_input_type,),
        "return self == SpeculativeAlgorithm.DFLASH": (GatePattern.dflash_attribute,),
        "return algo.is_dflash_family() or is_dflash()": (
            GatePattern.is_dflash,
            GatePattern.is_dflash_family,
        ),
        'if args.algo == "DFLASH" or args.algo != "DFLASH":': (GatePattern.dflash_literal,),
        "return SpeculativeAlgorithm.DFLASH.name": (GatePattern.dflash_attribute,),
    }


def test_gate_sites_name_the_innermost_enclosing_scope() -> None:
    functions = sorted({function for function, _ in _sites().values()})
    assert functions == ["<module>", "Input", "Input.is_dflash", "Input.run.inner", "outer"]


def test_gate_sites_carry_file_and_stripped_text() -> None:
    site = find_gate_sites(PurePosixPath("sglang/x.py"), b"if a:\n    b = 'DFLASH'  \n")[0]
    assert (site.file, site.line, site.function, site.text) == (
        PurePosixPath("sglang/x.py"),
        2,
        "<module>",
        "b = 'DFLASH'",
    )


def test_gate_sites_raise_on_unparsable_source() -> None:
    with pytest.raises(SyntaxError):
        find_gate_sites(PurePosixPath("sglang/bad.py"), b"def broken(:\n")
