"""`python -m peg.apps ARGS` is `peg ARGS`."""

import sys

from peg.apps.cli import main

if __name__ == "__main__":
    sys.exit(main())
