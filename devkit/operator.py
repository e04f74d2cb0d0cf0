"""`python -m devkit.operator ARGS`: `python -m tailtune operator ARGS` with tailtune's INFO logs on stderr.

The demo runs the operator through this so its log file shows every tuner tick and decision (kopf's own
per-handler chatter stays at WARNING). It runs the `tailtune` program as `python -m tailtune` would (runpy),
so devkit stays a user of the product's command line and imports nothing above tailtune's layers.
"""

from __future__ import annotations

import logging
import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    """Configure logging, then run `python -m tailtune operator` with `argv`; return its exit code."""
    logging.getLogger("tailtune").setLevel(logging.INFO)  # kopf's handler prints them
    logging.getLogger("kopf").setLevel(logging.WARNING)
    sys.argv = ["tailtune", "operator", *(sys.argv[1:] if argv is None else argv)]
    try:
        runpy.run_module("tailtune", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
