"""The fleet tests' hosts: the stand-in fixtures of tests/validate (one container running the
stand-in per host; test_fleet_hosts.py boots two more beside `standin_lab`)."""

from validate.conftest import standin_lab, standin_root

__all__ = ["standin_lab", "standin_root"]
