import sys

from rollmux.cli import main

sys.exit(main())
