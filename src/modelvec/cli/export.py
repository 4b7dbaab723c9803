"""``modelvec export``: Write one row per stored vector: model, base, representation parameters, datasets, vector."""

from __future__ import annotations

from pathlib import Path

import typer

from .options import StoreOpt, WaitOpt
from .printing import console, printable, say
from .shell import command, left_out, open_store


@command()
def export(
    parquet: Path = typer.Option(..., "--parquet", metavar="FILE", help="Parquet file to write."),
    store: Path | None = StoreOpt,
    wait: float | None = WaitOpt,
) -> None:
    """Write one row per stored vector: model, base, representation parameters, datasets, vector."""
    from ..store.views.export import export_parquet  # pyarrow's Parquet writer, only for an export

    damaged: dict[str, str] = {}
    with open_store(store, wait, read_only=True) as db:
        count = export_parquet(db, parquet, damaged)
    say(console, f"wrote {count} vectors to {printable(parquet)}")
    left_out(damaged)
