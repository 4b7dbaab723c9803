"""The ``modelvec`` command line: a thin shell over the Python API, one module per command.

Every command is one call of a public API function and the printing of what it returns; ``--json``
prints exactly the API's answer (``as_json()``). Failures are handled in one place
(:class:`_OneLineErrors`): a :class:`~modelvec.core.errors.ModelvecError` (a bad model, a busy or
damaged store, a Hub that does not answer, nothing stored: :class:`~modelvec.core.errors.NothingStoredError`)
or a ``ValueError`` (a bad option value) prints one line on stderr and exits with status 2.
Options that take several values accept them repeated or comma-separated
(``--threshold 0.5,0.9 --threshold 0.99``). Nothing heavy is imported until a command runs, and the
console script imports only the command it runs, so ``modelvec --help`` and ``modelvec show`` start
without torch and ``modelvec neighbors`` without the Hub client.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .whole import app

#: The commands, each the module of this package that defines it.
COMMANDS = ("cluster", "compact", "discover", "embed", "evaluate", "export", "neighbors", "rank", "show", "tree")

__getattr__, __dir__, __all__ = lazy_exports(__name__, {"whole": ("app",)}, eager=("COMMANDS", "main"))


def main() -> None:
    """The console script: ``modelvec ...``; only the command named is imported (every one for the app's help)."""
    first = sys.argv[1] if len(sys.argv) > 1 else None
    for name in (first,) if first in COMMANDS else COMMANDS:
        importlib.import_module(f"{__name__}.{name}")
    from .shell import app as registered

    registered(prog_name="modelvec")
