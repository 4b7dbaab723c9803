"""``modelvec show``: List what is stored: vectors per base and representation, and failures (with their kind)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ..represent.representation import Representation
from ..store import overview
from .options import JsonOpt, StoreOpt, WaitOpt
from .printing import console, print_json, print_table, printable, say, short_name, whole_column
from .shell import command, open_store


@command()
def show(
    store: Path | None = StoreOpt,
    failures: bool = typer.Option(True, help="Also list failures."),
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List what is stored: vectors per base and representation, and failures (with their kind)."""
    with open_store(store, wait, read_only=True) as db:
        stored = overview(db)
    if as_json:
        print_json(stored.as_json())
        return
    table = Table(
        whole_column("base"),
        whole_column("representation"),
        "architecture",
        "models",
        "dim",
        "s/model",
        title=f"vectors in {printable(db.path)} (s/model: mean seconds to embed one)",
    )
    default = Representation().key()
    for row in stored.summary.itertuples():
        key = row.params + (" (default)" if row.params == default else "")
        table.add_row(
            short_name(row.base),
            key,
            printable(row.architecture),
            str(row.models),
            str(row.dim),
            f"{row.mean_seconds:.3f}",
        )
    print_table(console, table)
    if not stored.models.empty:
        noted = stored.models["state"].notna().any()
        models = Table(
            whole_column("model"),
            whole_column("datasets"),
            "vectors",
            "s/vector",
            *([whole_column("note")] if noted else []),
            title="models (s/vector: mean)",
        )
        for model, rows in stored.models.groupby("model", sort=True):  # one row per model, not per vector
            datasets = sorted({d for ds in rows["datasets"] for d in ds})
            cells = [
                short_name(str(model)),
                ", ".join(map(printable, datasets)) or "-",
                str(len(rows)),
                f"{rows['seconds'].mean():.2f}",
            ]
            states = sorted({_shown(s, c) for s, c in zip(rows["state"], rows["copy_of"]) if isinstance(s, str)})
            models.add_row(*cells, *([_state_words(states, len(rows))] if noted else []))
        print_table(console, models)
    for row in stored.stale.itertuples():
        say(
            console,
            f"{row.vectors} vector{'s' if row.vectors != 1 else ''} of {short_name(row.base)} were embedded against an "
            f"earlier version of the base ({printable(row.base_hash)}): the reports leave them out; embed those "
            "models again, or drop them with `modelvec compact`",
        )
    if failures and not stored.failures.empty:
        table = Table(
            whole_column("model"),
            "kind",
            "error",
            title="failures (content: skipped while the weights are unchanged; "
            "resource, transient: tried again next run)",
        )
        for row in stored.failures.itertuples():
            table.add_row(short_name(row.model), row.kind, printable(row.error))
        print_table(console, table)


def _shown(state: str, original: object) -> str:
    """A vector's state as printed: a copy's original named as the user likely typed it (:func:`short_name`)."""
    return state.replace(original, short_name(original)) if isinstance(original, str) else printable(state)


def _state_words(states: list[str], vectors: int) -> str:
    """A model's vectors' states in words: a copy of the base (its weights are the base's), or stale."""
    words = {"copy of the base": "a copy of the base (its weights are the base's)", "stale": "stale"}
    said = [words.get(s, s) for s in states]
    if "stale" in states and vectors > 1:
        said[states.index("stale")] = "a stale vector (an earlier version of the base)"
    return "; ".join(said)
