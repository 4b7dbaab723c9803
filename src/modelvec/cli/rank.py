"""``modelvec rank``: How the rank of every matrix changes with depth: figures per threshold, every value, fitted laws."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from .common import (
    JsonOpt,
    StoreOpt,
    app,
    console,
    err,
    fmt,
    numbers,
    print_json,
    say,
    short_name,
    whole_column,
)


@app.command()
def rank(
    model: str | None = typer.Argument(None, help="The model whose matrices to study (folder, weights file or .gguf)."),
    base: Path | None = typer.Option(None, "--base", help="The base, for --of delta."),
    of: str = typer.Option("weights", "--of", help="Study the weights W, or the delta W - W_base: weights|delta."),
    threshold: list[str] = typer.Option(
        ["0.5,0.9,0.99"],
        "--threshold",
        help="Energy thresholds, repeated or comma-separated: --threshold 0.5,0.9,0.99.",
    ),
    over_finetunes: str | None = typer.Option(
        None, "--over-finetunes", metavar="BASE", help="Study the deltas of every stored fine-tune of BASE."
    ),
    out: Path = typer.Option(Path("modelvec-out/rank"), "--out", help="Folder for the figures, CSV and JSON."),
    as_json: bool = JsonOpt,
    store: Path | None = StoreOpt,
) -> None:
    """How the rank of every matrix changes with depth: figures per threshold, every value, fitted laws."""
    from ..report import depth_report

    study = depth_report(
        model, base=base, of=of, thresholds=numbers(threshold), over_finetunes=over_finetunes, store=store, out=out
    )
    for reason in study.failed.values():
        say(err, f"failed: {reason}")
    for warning in study.warnings:
        say(err, f"warning: {warning}")
    if as_json:
        print_json(study.records())
        return
    table = Table(
        "stack",
        "family",
        "threshold",
        whole_column("best law (adj. R²)"),
        whole_column("equation"),
        whole_column("runner-up"),
        title=f"rank of {'ΔW' if study.of == 'delta' else 'W'} across depth: {short_name(study.model)}",
    )
    for (stack, family, t), fits in study.fits.items():
        best, second = fits[0], (fits[1] if len(fits) > 1 else None)
        table.add_row(
            stack,
            family,
            f"{t:g}",
            f"{best.name} ({fmt(best.adj_r2)})",
            best.equation,
            f"{second.name} ({fmt(second.adj_r2)})" if second else "-",
        )
    console.print(table)
    for kind, path in study.files.items():
        say(console, f"{kind}: {path}")
