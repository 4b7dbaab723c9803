"""The ``modelvec`` command line: a thin layer over the Python API."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import ModelvecError
from .pipeline import embed as embed_models
from .representation import FACTORS, POOLINGS, SIGNS, SOLVERS
from .store import Store, default_store_path

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Turn fine-tuned transformers into vectors from their weight deltas.")
console = Console()
err = Console(stderr=True)

StoreOpt = typer.Option(None, "--store", help="DuckDB store (default: $MODELVEC_STORE or ./modelvec.duckdb).")


def _short(name: str) -> str:
    """A stored model or base as the user likely typed it: relative to the working folder when inside it."""
    try:
        return str(Path(name).relative_to(Path.cwd()))
    except ValueError:
        return name


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise typer.BadParameter(f"must be one of {', '.join(allowed)}", param_hint=name)
    return value


@app.command()
def embed(
    models: List[Path] = typer.Argument(..., help="Fine-tuned models: folders or weight files."),
    base: Path = typer.Option(..., "--base", help="The base model the fine-tunes start from."),
    rank: int = typer.Option(8, "--rank", min=1, help="Rank r of the truncated SVD of each delta."),
    factor: str = typer.Option("U", help=f"Factor kept: {'|'.join(FACTORS)}."),
    pooling: str = typer.Option("mean", help=f"Layer pooling: {'|'.join(POOLINGS)}."),
    solver: str = typer.Option("randomized", help=f"SVD solver: {'|'.join(SOLVERS)}."),
    sign: str = typer.Option("max-abs", help=f"Sign canonicalisation: {'|'.join(SIGNS)}."),
    n_iter: int = typer.Option(4, "--n-iter", min=0, help="Block Krylov iterations of the randomized solver (accuracy vs speed)."),
    oversamples: int = typer.Option(8, "--oversamples", min=0, help="Extra columns of the randomized solver's sketch."),
    seed: int = typer.Option(0, help="Seed of the randomized solver."),
    device: str = typer.Option("cpu", help="torch device for deltas and SVDs."),
    store: Optional[Path] = StoreOpt,
    force: bool = typer.Option(False, "--force", help="Recompute models already stored."),
) -> None:
    """Embed fine-tunes of BASE into the store (skips what is stored; records failures and goes on)."""
    _choice(factor, FACTORS, "--factor")
    _choice(pooling, POOLINGS, "--pooling")
    _choice(solver, SOLVERS, "--solver")
    _choice(sign, SIGNS, "--sign")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("embedding", total=len(models))

        def report(model: str, status: str, detail: str) -> None:
            bar.advance(task)

        try:
            result = embed_models(
                base, models, rank=rank, factor=factor, pooling=pooling, solver=solver, sign=sign, n_iter=n_iter,
                n_oversamples=oversamples, seed=seed,
                device=device, store=store, force=force, progress=report,
            )
        except ModelvecError as exc:
            err.print(f"error: base {exc}", soft_wrap=True, markup=False, highlight=False)
            raise typer.Exit(2)
    console.print(
        f"embedded {len(result.embedded)}, skipped {len(result.skipped)} (already stored), failed {len(result.failed)}"
        f" -> {store or default_store_path()}",
        soft_wrap=True, markup=False, highlight=False,
    )
    for reason in result.failed.values():
        console.print(f"  failed: {reason}", soft_wrap=True, markup=False, highlight=False)
    if result.failed and not result.embedded and not result.skipped:
        raise typer.Exit(1)


@app.command()
def show(store: Optional[Path] = StoreOpt, failures: bool = typer.Option(True, help="Also list failures.")) -> None:
    """List what is stored: vectors per base and representation, and failures."""
    with Store(store) as db:
        summary = db.summary()
        table = Table("base", "representation", "architecture", "models", "dim", "mean s/model", title=f"vectors in {db.path}")
        for row in summary.itertuples():
            table.add_row(_short(row.base), row.params, row.architecture, str(row.models), str(row.dim), f"{row.mean_seconds:.3f}")
        console.print(table)
        meta = db.metadata()
        if not meta.empty:
            models = Table("model", "datasets", "dim", "seconds", title="models")
            for row in meta.itertuples():
                models.add_row(_short(row.model), ", ".join(row.datasets) or "-", str(row.dim), f"{row.seconds:.2f}")
            console.print(models)
        fails = db.failures()
        if failures and not fails.empty:
            table = Table("model", "error", title="failures")
            for row in fails.itertuples():
                table.add_row(_short(row.model), row.error)
            console.print(table)


@app.command()
def export(
    parquet: Path = typer.Option(..., "--parquet", help="Parquet file to write."),
    store: Optional[Path] = StoreOpt,
) -> None:
    """Write one row per stored vector: model, base, representation parameters, datasets, vector."""
    with Store(store) as db:
        count = db.export_parquet(parquet)
    console.print(f"wrote {count} vectors to {parquet}")


if __name__ == "__main__":  # pragma: no cover
    app()
