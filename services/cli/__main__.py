"""`python -m services.cli`: the `ferry` command, as the console script runs it."""

import sys

from services.cli.main import main

sys.exit(main())
