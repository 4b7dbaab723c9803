"""``modelvec show``: List what is stored: vectors per base and representation, and failures (with their kind)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ..represent.representation import Representation
from .common import (
    JsonOpt,
    StoreOpt,
    WaitOpt,
    command,
    console,
    open_store,
    print_json,
    print_table,
    short_name,
    whole_column,
)


@command()
def show(
    store: Path | None = StoreOpt,
    failures: bool = typer.Option(True, help="Also list failures."),
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List what is stored: vectors per base and representation, and failures (with their kind)."""
    with open_store(store, wait, read_only=True) as db:
        overview = db.overview()
    if as_json:
        print_json(overview.as_json())
        return
    table = Table(
        whole_column("base"),
        whole_column("representation"),
        "architecture",
        "models",
        "dim",
        "s/model",
        title=f"vectors in {db.path} (s/model: mean seconds to embed one)",
    )
    default = Representation().key()
    for row in overview.summary.itertuples():
        key = row.params + (" (default)" if row.params == default else "")
        table.add_row(
            short_name(row.base), key, row.architecture, str(row.models), str(row.dim), f"{row.mean_seconds:.3f}"
        )
    print_table(console, table)
    if not overview.models.empty:
        models = Table(
            whole_column("model"), whole_column("datasets"), "vectors", "s/vector", title="models (s/vector: mean)"
        )
        for model, rows in overview.models.groupby("model", sort=True):  # one row per model, not per vector
            datasets = sorted({d for ds in rows["datasets"] for d in ds})
            models.add_row(
                short_name(str(model)), ", ".join(datasets) or "-", str(len(rows)), f"{rows['seconds'].mean():.2f}"
            )
        print_table(console, models)
    if failures and not overview.failures.empty:
        table = Table(
            whole_column("model"),
            "kind",
            "error",
            title="failures (content: skipped while the weights are unchanged; "
            "resource, transient: tried again next run)",
        )
        for row in overview.failures.itertuples():
            table.add_row(short_name(row.model), row.kind, row.error)
        print_table(console, table)
