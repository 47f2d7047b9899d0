"""`python -m tenure.cli`: the `tenure` command."""

import sys

from tenure.cli import main

sys.exit(main())
