"""`python -m tailtune.engine_builder`."""

import sys

from tailtune.engine_builder.cli import main

sys.exit(main())
