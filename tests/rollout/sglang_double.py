"""TEST DOUBLE for `python -m sglang.launch_server`, used only by the lifecycle tests.

A real SGLang server cannot start without GPUs, so the unit under test launches this module
instead (`service.launch_module`). It is deliberately tiny and serves nothing: it writes the
argv and the environment entries the tests check to `$DDTREE_DOUBLE_ARGV_FILE` as JSON, then
sleeps until systemd stops it. With `DDTREE_DOUBLE_FAIL_ALGO=<ALGO>` it prints its arguments
to stderr (so the journal holds the API key, which reports must mask) and exits 3 when
`--speculative-algorithm` is that algorithm. The validation gates replace it with a full HTTP
stand-in that parses arguments with the real SGLang parser.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main() -> int:
    argv = sys.argv[1:]
    algo = (
        argv[argv.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in argv else ""
    )
    if algo and os.environ.get("DDTREE_DOUBLE_FAIL_ALGO") == algo:
        print(
            f"double: failing on purpose for {algo}: {' '.join(argv)}", file=sys.stderr, flush=True
        )
        return 3
    record = {
        "argv": argv,
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")},
    }
    path = Path(os.environ["DDTREE_DOUBLE_ARGV_FILE"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
