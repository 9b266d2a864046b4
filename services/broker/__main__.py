import sys

from services.broker.cli import main

sys.exit(main())
