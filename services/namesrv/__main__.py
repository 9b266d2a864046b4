import sys

from services.namesrv.cli import main

sys.exit(main())
