import sys

from services.proxy.cli import main

sys.exit(main())
