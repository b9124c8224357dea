"""The watch tests' servers and hosts: the stand-in fixtures of tests/validate."""

from validate.conftest import standin_lab, standin_root

__all__ = ["standin_lab", "standin_root"]
