"""The ``modelvec`` command line: a thin shell over the Python API, one module per command.

Every command is one call of a public API function and the printing of what it returns; ``--json``
prints exactly the API's answer (``as_json()``). Failures are handled in one place
(:class:`_OneLineErrors`): a :class:`~modelvec.core.errors.ModelvecError` (a bad model, a busy or
damaged store, a Hub that does not answer, nothing stored: :class:`~modelvec.core.errors.NothingStoredError`)
or a ``ValueError`` (a bad option value) prints one line on stderr and exits with status 2.
Options that take several values accept them repeated or comma-separated
(``--threshold 0.5,0.9 --threshold 0.99``). Nothing heavy is imported until a command runs, so
``modelvec --help`` and ``modelvec show`` start without torch.
"""

from __future__ import annotations

from . import cluster, compact, discover, embed, evaluate, export, neighbors, rank, show, tree
from .app import app

__all__ = ["app", "main"]


def main() -> None:
    """The console script: ``modelvec ...``."""
    app(prog_name="modelvec")
