"""``python -m modelvec.testing.localhub``: runs the command line (:func:`.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
