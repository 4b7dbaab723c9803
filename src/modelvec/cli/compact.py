"""``modelvec compact``: Drop the bytes of replaced vectors from the store's vector file (safe to interrupt)."""

from __future__ import annotations

from pathlib import Path

from .options import StoreOpt
from .printing import console, printable, say, short_name
from .shell import command, open_store


@command()
def compact(store: Path | None = StoreOpt) -> None:
    """Drop the vectors embedded against an earlier version of their base, and the bytes of replaced vectors, from
    the store (safe to interrupt)."""
    with open_store(store) as db:
        stale = db.versions.stale()
        before, after = db.writes.compact(stale)
    for row in stale.itertuples():
        say(
            console,
            f"dropped {row.vectors} vector{'s' if row.vectors != 1 else ''} of {short_name(row.base)} embedded against "
            f"an earlier version of the base ({printable(row.base_hash)})",
        )
    say(console, f"{printable(db.vector_file.path.name)}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
