"""`python -m tailtune`."""

from tailtune.cli import main

raise SystemExit(main())
