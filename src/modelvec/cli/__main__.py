"""``python -m modelvec.cli``: the same as the ``modelvec`` console script."""

from . import main

main()
