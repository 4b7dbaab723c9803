"""``modelvec neighbors``: The stored models nearest to MODEL, with distance and labels, and its predicted dataset."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from ..analyse.scores import NEIGHBORS_SCORING, Scoring
from ..represent.representation import Representation
from ..store.derived.products import Compute
from .options import JsonOpt, StoreOpt, WaitOpt, with_settings
from .printing import (
    console,
    err,
    fmt,
    how_near,
    notes,
    print_json,
    print_table,
    printable,
    say,
    short_name,
    whole_column,
)
from .shell import command, left_out, open_store

if TYPE_CHECKING:
    from ..report.nearest import Neighbors


@command()
@with_settings(Representation, "representation")
@with_settings(
    Scoring,
    "scoring",
    only=("metric", "scaling", "k"),
    defaults=NEIGHBORS_SCORING,
    helps={"k": "How many nearest stored models are listed (and vote for the predicted dataset)."},
)
@with_settings(Compute, "compute", only=("neighbours",))
def neighbors(
    model: str = typer.Argument(
        ..., metavar="MODEL", help="A model: stored, or a local folder or Hub id to embed on the fly."
    ),
    base: str | None = typer.Option(
        None, "--base", metavar="BASE", help="The stored base to compare against (default: the only one)."
    ),
    scoring: Scoring = None,  # type: ignore[assignment]  # its options: with_settings
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    compute: Compute = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
    explain: bool = typer.Option(
        False, "--explain", help="Show which layers and families carry the similarity to each neighbour."
    ),
) -> None:
    """The stored models nearest to MODEL, with distance and labels, and its predicted dataset.

    A model that is not in the store is embedded now with the same representation against the
    stored base, compared, and not stored.
    """
    from ..report import neighbors as find

    with open_store(store, wait, read_only=True) as db:
        found = find(
            model,
            representation=representation,
            scoring=scoring,
            store=db,
            base=base,
            explain=explain,
            neighbours=compute.neighbours,
        )
    if as_json:
        print_json(found.as_json())
        notes(found.notes + found.repaired)
        left_out(found.damaged)
        return
    if found.on_the_fly:
        say(
            err,
            f"{short_name(found.query)} is not in the store: embedded now ({found.params}, base {short_name(found.base)}), "
            "not stored",
        )
    if found.tree is not None:
        say(console, _place_line(found.query, found.tree))
    if found.warning:
        say(err, f"warning: {printable(found.warning)}")
    if found.scaling_note:
        say(err, printable(found.scaling_note))
    _show_nearest(found, scoring.metric)
    _show_explanation(found)
    notes(found.notes + found.repaired)
    left_out(found.damaged)


def _show_nearest(found: Neighbors, metric: str) -> None:
    """The nearest stored models as a table, and the dataset they predict."""
    rows = [
        [
            str(i),
            short_name(row.model),
            f"{row.distance:.4f}",
            ", ".join(map(printable, row.datasets)) or "-",
            printable(row.author) if isinstance(row.author, str) and row.author else "-",
        ]
        for i, row in enumerate(found.nearest.itertuples(), 1)
    ]
    authors = any(row[4] != "-" for row in rows)  # local folders have none: no column of dashes
    datasets = whole_column("datasets")
    datasets.min_width = min(max([len(row[3]) for row in rows] + [8]), 24)  # dataset names whole where they fit
    table = Table(
        "#",
        whole_column("model"),
        "distance",
        datasets,
        *(["author"] if authors else []),
        title=f"nearest to {short_name(found.query)} ({metric} distance)",
    )
    for row in rows:
        table.add_row(*(row if authors else row[:4]))
    print_table(console, table, key=2)
    if found.predicted is None:
        console.print("predicted dataset: none (no labelled neighbour)")
    else:
        votes = ", ".join(f"{printable(name)} {n}" for name, n in found.votes.items())
        say(
            console,
            f"predicted dataset: {printable(found.predicted)} (confidence {fmt(found.confidence)} = vote share "
            f"{found.vote_share:.2f} x closeness {fmt(found.closeness)}; votes of the {found.voters} nearest labelled "
            f"model{'s' if found.voters != 1 else ''}: {votes}; {how_near(found.closeness)})",
        )


def _show_explanation(found: Neighbors) -> None:
    """Per neighbour, the families (and the top blocks) that carry its cosine to the query (``--explain``)."""
    for item in found.explanation or []:
        families = ", ".join(f"{f} {v:+.3f}" for f, v in sorted(item["by_family"].items(), key=lambda kv: -kv[1]))
        line = f"{short_name(item['model'])}: cosine {item['cosine']:.3f} = families {families}"
        if any(b["layer"] is not None for b in item["blocks"]):  # with layers averaged the blocks are the families
            top = ", ".join(
                f"{b['family']}{'' if b['layer'] is None else ' L' + str(b['layer'] + 1)} {b['share']:+.3f}"
                for b in item["blocks"][:5]
            )
            line += f"; top blocks {top}"
        say(console, line)


def _place_line(query: str, node: dict) -> str:
    """The query's place in the model tree, one line: its kind, parent(s), confidence, and a card that disagrees."""
    parents = " + ".join(short_name(p) for p in node["parents"]) or "none"
    line = f"{short_name(query)}: {node['kind']} of {parents} (confidence {node['confidence']:.2f})"
    if node["kind"] == "unrelated":
        line = f"{short_name(query)}: unrelated weights, no parent (confidence {node['confidence']:.2f})"
    said = node["declared"]
    if not node["agrees"]:
        what = f"{printable(said['relation'])} of" if said["relation"] else "a derivative of"
        line += f"; its card says {what} {' + '.join(short_name(p) for p in said['parents'])}"
    return line
