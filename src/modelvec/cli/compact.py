"""``modelvec compact``: Drop the bytes of replaced vectors from the store's vector file (safe to interrupt)."""

from __future__ import annotations

from pathlib import Path

from .common import (
    StoreOpt,
    command,
    console,
    open_store,
    say,
)


@command()
def compact(store: Path | None = StoreOpt) -> None:
    """Drop the bytes of replaced vectors from the store's vector file (safe to interrupt)."""
    with open_store(store) as db:
        before, after = db.compact()
    say(console, f"{db.vector_file.path.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
