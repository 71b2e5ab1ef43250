import sys

from cutedebug.commands.cli import main

sys.exit(main())
