"""``modelvec cluster``: Score how well the stored vectors of BASE cluster by dataset, and draw the maps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from ..analyse.reduction import Reduction
from ..analyse.scores import Scoring
from ..represent.representation import Representation
from ..run.engines import Execution
from ..store.derived.products import Compute
from .options import JsonOpt, StoreOpt, WaitOpt, split_values, with_settings
from .printing import console, fmt, notes, print_json, printable, products_progress, say, short_name, whole_column
from .shell import command, left_out, open_store

if TYPE_CHECKING:
    from ..report.clusters import ClusterReport

#: What cluster's engine options mean to it: where the nearest lists' pass runs.
EXECUTION_HELPS = {
    "engine": "Where the nearest lists' pass runs (--neighbours lists, above 16,384 models): local, or ray (its held "
    "blocks as tasks on a Ray cluster; every node must see the store's files at the same path).",
    "workers": "--engine ray: tasks at once (default one per CPU of the cluster).",
}

#: Predictions a table shows (the most confident first); --json gives every one.
SHOWN_PREDICTIONS = 25

#: The clustering scores as a table says them (keys of ``ClusterReport.clustering``).
_CLUSTERING_WORDS = {
    "silhouette": "silhouette of the datasets (-1 to 1: how far apart)",
    "kmeans_nmi": "k-means clusters vs datasets: mutual information",
    "kmeans_ari": "k-means clusters vs datasets: adjusted Rand index",
    "hdbscan_nmi": "HDBSCAN clusters vs datasets: mutual information",
    "hdbscan_ari": "HDBSCAN clusters vs datasets: adjusted Rand index",
}


@command()
@with_settings(Representation, "representation")
@with_settings(Scoring, "scoring")
@with_settings(Reduction, "reduction")
@with_settings(Compute, "compute")
@with_settings(Execution, "execution", only=("engine", "workers", "address"), helps=EXECUTION_HELPS)
def cluster(
    base: str = typer.Argument(
        ..., metavar="BASE", help="The base whose stored fine-tunes to cluster (path or stored id)."
    ),
    reduction: Reduction = None,  # type: ignore[assignment]  # its options: with_settings
    scoring: Scoring = None,  # type: ignore[assignment]  # its options: with_settings
    out: Path = typer.Option(Path("modelvec-out"), "--out", metavar="DIR", help="Folder for the PNG and HTML maps."),
    as_json: bool = JsonOpt,
    label_source: list[str] | None = typer.Option(
        None,
        "--label-source",
        metavar="SOURCES",
        help="Keep only labels from these sources: card|model-index|tag|name|declared|guessed "
        "(repeated or comma-separated).",
    ),
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    compute: Compute = None,  # type: ignore[assignment]  # its options: with_settings
    execution: Execution = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    wait: float | None = WaitOpt,
) -> None:
    """Score how well the stored vectors of BASE cluster by dataset, and draw the maps."""
    from ..report import cluster as run_cluster

    with open_store(store, wait, read_only=True) as db, products_progress(not as_json) as progress:
        report = run_cluster(
            base,
            representation=representation,
            scoring=scoring,
            store=db,
            out=out,
            reduction=reduction,
            label_sources=split_values(label_source) or None,
            progress=progress,
            compute=compute,
            execution=execution,
        )
    if as_json:
        print_json(report.as_json())
    else:
        _show(report)
    notes(report.notes + report.repaired)
    left_out(report.damaged)


def _show(report: ClusterReport) -> None:
    """The report as tables and lines: the kNN score per dataset, the other scores, then what the scores mean."""
    table = Table(
        whole_column("dataset"),
        "models scored",
        "kNN dataset score",
        title=f"{short_name(report.base)} · {report.params}",
    )
    for dataset, entry in sorted(report.per_dataset.items()):
        table.add_row(printable(dataset), str(entry["count"]), fmt(entry["score"]))
    table.add_row("all", str(report.n_scored), fmt(report.knn_score))
    console.print(table)
    how = f"metric {report.metric}" + (f" · {report.scaling}" if report.scaling != "none" else "")
    scores = Table(whole_column("score"), "value", title=f"{report.n_models} models · {how} · pool {report.pool}")
    scores.add_row(
        f"dataset by a vote of its {report.k} nearest, each model left out (accuracy)",
        fmt(report.loo_accuracy),
    )
    if report.n_authors:
        scores.add_row(
            f"kNN score, same-author neighbours excluded ({report.n_scored_other_authors} scored)",
            fmt(report.knn_score_other_authors),
        )
        scores.add_row(f"authors ({report.n_authors}): share of the most prolific", fmt(report.largest_author_share))
    clustered = int(report.clustering.get("n_clustered", 0))
    if clustered:
        for key, words in _CLUSTERING_WORDS.items():
            low, high = report.clustering.get(f"{key}_low"), report.clustering.get(f"{key}_high")
            interval = f" [{fmt(low)}, {fmt(high)}]" if low is not None and high is not None else ""
            scores.add_row(words, fmt(report.clustering[key]) + interval)
    console.print(scores)
    most = max((int(entry["count"]) for entry in report.per_dataset.values()), default=0)
    if most > 1 and most - 1 <= report.k / 2:  # a model's own dataset cannot hold a majority of the votes
        say(
            console,
            f"the vote: a dataset has at most {most - 1} other models here, no majority of {report.k} voters, so a "
            f"model's own dataset is easily outvoted; --k {most - 1} votes among its nearest few",
        )
    of_all = int(report.clustering.get("n_clusterable", 0))
    if clustered:
        which = f"a seeded sample of {clustered:,} of the {of_all:,}" if of_all else f"the {clustered}"
        say(
            console,
            f"clusterers blind to the labels, on {which} models tuned on one dataset that has two or more: 1 = "
            "they find the datasets exactly, 0 = no better than chance"
            + (" (95 % bootstrap intervals over the sample)" if of_all else ""),
        )
    else:
        say(console, "no clustering scores: they need two datasets with two or more models tuned on one dataset only")
    _show_more(report)


def _show_more(report: ClusterReport) -> None:
    """The predictions for unlabelled models, the blocks that separate the datasets best, and the files written."""
    if report.predictions:
        preds = Table(
            whole_column("unlabelled model"), whole_column("predicted dataset"), "votes", "closeness", "confidence"
        )
        ordered = report.predictions  # as the models are; where there are too many, the most confident first
        if len(ordered) > SHOWN_PREDICTIONS:
            ordered = sorted(ordered, key=lambda p: -p["confidence"] if p["confidence"] == p["confidence"] else 1)
        for p in ordered[:SHOWN_PREDICTIONS]:
            preds.add_row(
                short_name(p["model"]),
                printable(p["predicted"]),
                fmt(p["vote_share"]),
                fmt(p["closeness"]),
                fmt(p["confidence"]),
            )
        console.print(preds)
        if len(ordered) > SHOWN_PREDICTIONS:
            say(console, f"{len(ordered) - SHOWN_PREDICTIONS:,} more predictions (the most confident shown): --json")
        say(
            console,
            "confidence = the winner's share of the votes x closeness (1: its nearest labelled model is as "
            "near as stored models are to theirs; 0: farther than any)",
        )
    if report.per_block:
        best = sorted(report.per_block, key=lambda b: -b["knn_score"])[:3]
        names = ", ".join(
            f"{b['family']}{'' if b['layer'] is None else ' layer ' + str(b['layer'] + 1)} {b['knn_score']:.2f}"
            for b in best
        )
        say(console, f"blocks that separate the datasets best (kNN score of the block alone): {names}")
    elif report.per_block_note:
        say(console, printable(report.per_block_note))
    if report.scaling_note:
        say(console, printable(report.scaling_note))
    for kind, path in report.files.items():
        shown = printable(path)
        say(console, f"{kind.upper()} map: {shown}" if kind != "blocks" else f"per-block kNN heat map: {shown}")
    if report.reduce_note:
        say(console, f"map: {printable(report.reduce_note)}")
