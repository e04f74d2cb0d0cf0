"""`python -m tailtune.dev.operator ARGS`: `tailtune operator ARGS` with tailtune's INFO logs on stderr.

The demo runs the operator through this so its log file shows every tuner tick and decision (kopf's own
per-handler chatter stays at WARNING).
"""

from __future__ import annotations

import logging
import sys

from tailtune.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    """Configure logging, then run `tailtune operator` with `argv`."""
    logging.getLogger("tailtune").setLevel(logging.INFO)  # kopf's handler prints them
    logging.getLogger("kopf").setLevel(logging.WARNING)
    return cli_main(["operator", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
