"""``modelvec evaluate``: Embed MODELS with every representation and print their scores side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from ..analyse.scores import Scoring
from ..represent.representation import Representation
from ..studies.sweep import SWEPT, Sweep
from .options import JsonOpt, StoreOpt, split_values, with_settings
from .printing import console, err, fmt, print_json, printable, say
from .shell import command
from .sweeps import with_sweeps

if TYPE_CHECKING:
    import pandas as pd

#: The plural flags the swept fields had before their options were made from the declarations (kept for scripts).
ALIASES = {"rank": ("--ranks",), "projection": ("--projections",), "seed": ("--seeds",)}


@command()
@with_settings(Scoring, "scoring", only=("metric", "k"))
@with_sweeps(
    Representation, "sweep", only=SWEPT, aliases=ALIASES, notes={"seed": "the scores are their mean and spread"}
)
def evaluate(
    models: list[Path] = typer.Argument(
        ..., metavar="MODEL", help="Fine-tuned models (or LoRA adapters) with dataset labels in their cards."
    ),
    base: Path = typer.Option(..., "--base", metavar="BASE", help="The base model."),
    scoring: Scoring = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    as_json: bool = JsonOpt,
    markdown: Path | None = typer.Option(None, "--markdown", metavar="FILE", help="Also write the table as Markdown."),
    selection: list[str] | None = typer.Option(
        None,
        "--selection",
        metavar="DATASETS",
        help="Datasets of the selection half, repeated or comma-separated (default: half of them, fixed by name).",
    ),
    split: bool | None = typer.Option(
        None, "--split/--no-split", help="Score a selection and a report half (default: with 4 or more datasets)."
    ),
    sweep: dict[str, tuple[Any, ...]] | None = None,  # its options: with_sweeps
    center: bool = typer.Option(False, "--center", help="Also score every variant centred on the models' mean."),
    mutual_proximity: bool = typer.Option(
        False,
        "--mutual-proximity",
        help="Also score every variant with neighbours ranked by mutual proximity (for adapters beside full fine-tunes).",
    ),
    vocabulary_head: bool = typer.Option(
        False,
        "--vocabulary-head",
        help="Also score the sketches of the first projection and rows with the head's vocabulary prior appended "
        "(--head).",
    ),
    svd: bool = typer.Option(True, "--svd/--no-svd", help="Also score the SVD factors (U, U·Σ, singular values)."),
) -> None:
    """Embed MODELS with every representation and print their scores side by side.

    With a split, the method picked on the selection half is marked, and the report half's kNN score
    comes with a 95 % bootstrap interval over models.
    """
    from ..studies import evaluate as run_evaluate
    from ..studies import variants

    swept = Sweep(**(sweep or {}))
    table = run_evaluate(
        base,
        models,
        variants=variants(swept, vocabulary_head, svd=svd),
        seeds=swept["seed"],
        store=store,
        scoring=scoring,
        progress=lambda msg: say(err, printable(msg)),
        split=split,
        selection=split_values(selection) if selection else None,
        center=center,
        mutual_proximity=mutual_proximity,
    )
    if markdown is not None:
        from ..core.output import write_atomically  # a full disk names the file; never half a table

        text = table.to_markdown(index=False, floatfmt=".3f") + "\n"
        write_atomically(markdown, lambda tmp: Path(tmp).write_text(text))
    if as_json:
        print_json(table.to_dict(orient="records"))
        return
    _print(table, len(models))


def _print(table: pd.DataFrame, n_models: int) -> None:
    """The table's main columns (a Markdown table where the output is not a terminal), then the method picked and
    its kNN score on each half."""
    extra = [c for c in ("knn_full", "knn_adapters", "adapter_to_full") if c in table.columns]
    if table["knn_spread"].any():
        extra.append("knn_spread")
    shown = ["method", "half", "dim", "seconds_per_model", "knn_score", "knn_lo", "knn_hi", "loo_accuracy", "ref_corr"]
    shown += extra
    picked = table[table["selected"]]["method"].iloc[0]
    if not console.is_terminal:  # a log or a pipe: a Markdown table stays readable at any width
        print(table[shown].to_markdown(index=False, floatfmt=".3f"))
    else:
        out = Table(*[c.replace("_", " ") for c in shown], title=f"representations compared on {n_models} models")
        for row in table[shown].itertuples(index=False):
            out.add_row(*(fmt(v) for v in row))
        console.print(out)
        console.print("all columns: --json or --markdown FILE", style="dim")
    first = table["half"].iloc[0]
    say(console, f"best kNN score on {'all models' if first == 'all' else 'the ' + first + ' half'}: {picked}")
    for row in table[table["selected"]].itertuples(index=False):
        where = "all models" if row.half == "all" else f"{row.half} half"
        say(console, f"  {where}: kNN score {row.knn_score:.3f} [95 % CI {row.knn_lo:.3f}, {row.knn_hi:.3f}]")
