"""The README's host-file example composes exactly as written: copied into a folder of its own
and found through `hydra.searchpath`, as the README tells a user to do (no SSH: compose only)."""

from __future__ import annotations

import re
from pathlib import Path

from ddtree_deploy.config import compose_config

README = Path(__file__).resolve().parents[2] / "README.md"
YAML_BLOCK = re.compile(r"^```yaml\n(?P<text>.*?)^```", re.MULTILINE | re.DOTALL)


def _host_file_example() -> tuple[str, str]:
    """The README's host file: its text and the path its comment names (the one yaml block that
    names a file under conf/host/)."""
    examples = [
        (m["text"], path[1])
        for m in YAML_BLOCK.finditer(README.read_text())
        if (path := re.search(r"# (/\S+/conf/host/\S+\.yaml)", m["text"]))
    ]
    assert len(examples) == 1, "the README has one host-file example"
    return examples[0]


def test_readme_host_file_composes_as_written(tmp_path: Path) -> None:
    text, named = _host_file_example()
    conf = tmp_path / "conf"
    host_file = conf / "host" / Path(named).name
    host_file.parent.mkdir(parents=True)
    host_file.write_text(text)

    cfg = compose_config([f"hydra.searchpath=[file://{conf}]", f"host={host_file.stem}"])

    assert host_file.stem == "gpu7"
    assert (cfg.host.name, cfg.host.address, cfg.host.user) == (
        "gpu7",
        "gpu7.example.net",
        "deploy",
    )
    assert (cfg.host.sudo, cfg.host.gpu_count) == (True, 8)
    assert cfg.host.gpu_ids == list(range(8))
    assert cfg.host.sglang_venv == "/opt/sglang/venv"
    # The options it picks from conf/, not the default host's.
    assert (cfg.gpu.arch, cfg.abi.cuda, cfg.sglang.version) == ("sm_120", "12.8", "0.5.11")
