"""The app with every command registered: what ``from modelvec.cli import app`` gives (the console script
registers only the command it runs, :func:`modelvec.cli.main`)."""

from __future__ import annotations

from . import cluster, compact, discover, embed, evaluate, export, neighbors, rank, show, tree  # noqa: F401
from .shell import app

__all__ = ["app"]
