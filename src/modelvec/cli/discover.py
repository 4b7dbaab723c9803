"""``modelvec discover``: Find the fine-tunes of BASE on the Hub (HF_ENDPOINT) and store the catalogue; vectors are kept."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.table import Table

from ..core.tree import Scope
from .options import JsonOpt, StoreOpt, with_settings
from .printing import console, print_json, print_table, printable, say, whole_column
from .shell import command, open_store


@command()
@with_settings(Scope, "scope")
def discover(
    base: str = typer.Argument(
        ..., metavar="BASE", help="The base model on the Hub: bert-base-uncased, google-bert/bert-base-uncased, ..."
    ),
    scope: Scope = None,  # type: ignore[assignment]  # its options: with_settings
    show_rejected: bool = typer.Option(False, "--rejected", help="Also list the rejected candidates and why."),
    as_json: bool = JsonOpt,
    store: Path | None = StoreOpt,
) -> None:
    """Find the fine-tunes of BASE on the Hub (HF_ENDPOINT) and store the catalogue; vectors are kept."""
    from ..run import discover as find
    from ..store import default_store_path

    where = store if store is not None else default_store_path()
    if os.path.lexists(where):  # opened first: a wait for another process's run is said before any progress
        with open_store(store) as db:
            found = find(base, scope, store=db)
    else:  # made once the Hub has answered: a discovery that cannot start leaves no empty store behind
        found = find(base, scope, store=where)
    if as_json:
        print_json(found.as_json())
        return
    table = Table(
        whole_column("model"),
        "downloads",
        whole_column("datasets"),
        "labels from",
        "author",
        "why kept",
        title=f"fine-tunes of {printable(found.base)} @ {printable(found.base_sha[:12])}",
    )
    for e in found.in_tree_order(found.kept):
        table.add_row(
            ("  " * (e.depth - 1)) + printable(e.model) if e.relation else printable(e.model),
            str(e.downloads if e.downloads is not None else "-"),
            ", ".join(map(printable, e.datasets)) or "-",
            printable(e.label_source or "-"),
            printable(e.author or "-"),
            printable(e.reason),
        )
    print_table(console, table)
    if show_rejected and found.rejected:
        rejected = Table(whole_column("model"), "why rejected", title="rejected candidates")
        for e in found.rejected:
            rejected.add_row(printable(e.model), printable(e.reason))
        console.print(rejected)
    for note in found.notes:
        say(console, printable(note))
    quantized = [e for e in found.rejected if e.relation == "quantized" and "recorded, not mapped" in e.reason]
    if quantized and not show_rejected:
        what = "quantization" if len(quantized) == 1 else "quantizations"
        say(console, f"{len(quantized)} {what} recorded, not mapped (--rejected lists them)")
    say(console, f"kept {len(found.kept)}, rejected {len(found.rejected)} -> catalogue in {printable(where)}")
