#!/usr/bin/env python3
"""`python hack/cluster/cluster.py up|down|env|status`: the local cluster, `python -m devkit.cluster` (see there).

Kept for scripts and habits that call it by path; it runs devkit from this checkout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, where devkit/ lives

from devkit.cluster import main

if __name__ == "__main__":
    sys.exit(main())
