"""`python -m standin ARGS`: what the unit's ExecStart runs in place of `sglang.launch_server`."""

import sys

from standin.server import main

sys.exit(main())
