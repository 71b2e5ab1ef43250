import sys

from cutedebug.cli import main

sys.exit(main())
