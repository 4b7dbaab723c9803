"""The cluster report: one base's stored vectors scored against their dataset labels and mapped.

``cluster`` reads the vectors of one base and representation from the store, computes the kNN
dataset score, predictions for unlabelled models and the clustering scores, reduces the vectors to
2-D, and writes a PNG and a self-contained HTML page.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyse.reduction import METHODS
from ..analyse.reduction import reduce as reduce_to_2d
from ..analyse.scores import (
    Geometry,
    Scoring,
    block_knn_scores,
    clustering_scores,
    knn_dataset_score,
    predict_datasets,
)
from ..core.errors import ModelvecError, NothingStoredError
from ..core.files import weight_format
from ..core.names import display_name, is_hub_id, model_id
from ..hub.client import HubSettings
from ..hub.download import snapshot_folder
from ..hub.ids import resolve_base
from ..hub.labels import matches_source
from ..hub.partial import partial_folder
from ..plots.blocks import plot_block_scores
from ..plots.maps import plot_html, plot_png
from ..represent import blocks_of
from ..represent.representation import Representation
from ..store import Store, opened, options_of

PathLike = str | os.PathLike[str]


@dataclass
class ClusterReport:
    """Scores and written files of one ``cluster`` run; ``as_json()`` is the CLI's ``--json``."""

    base: str
    params: str
    n_models: int
    metric: str
    pool: str
    knn_score: float
    n_scored: int
    per_dataset: dict[str, dict[str, float]]
    loo_accuracy: float
    clustering: dict[str, float]
    predictions: list[dict[str, Any]]
    files: dict[str, str] = field(default_factory=dict)
    # Author effect: the kNN score when a model's same-author neighbours do not count.
    knn_score_other_authors: float = float("nan")
    n_scored_other_authors: int = 0
    n_authors: int = 0
    largest_author_share: float = float("nan")  # share of the models uploaded by the most prolific author
    label_sources: list[str] | None = None  # the label sources kept (None: all)
    #: the kNN dataset score of each block alone (stack, layer, family, knn_score); None when the base's
    #: files were not at hand to lay the blocks out
    per_block: list[dict[str, Any]] | None = None
    scaling: str = "none"  # how neighbours were ranked (``auto`` resolved: mutual proximity where kinds mix)
    scaling_note: str | None = None  # why, when ``auto`` chose it
    reduce: str = ""  # the map's reduction as drawn (``auto`` resolved)
    reduce_note: str | None = None  # why, when ``auto`` chose it
    per_block_note: str | None = None  # why there is no per-block score, when there is none
    k: int = 5  # the voters of the predictions and of ``loo_accuracy``

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "clustering"}
        out.update(self.clustering)
        return out


def _base_files(base: str, sha: str | None, settings: HubSettings) -> str | None:
    """The base's files on this machine: its folder, or a Hub base's snapshot in the Hub cache, or the rows of it
    that embed fetched (never fetched here: only the headers are needed, and ``cluster`` works offline)."""
    if os.path.exists(base):
        return base
    if not is_hub_id(base):
        return None
    try:
        folder = snapshot_folder(base, sha or "main", settings)
        if (folder is None or not weight_format(p.name for p in folder.iterdir())) and sha:
            folder = partial_folder(base, sha, settings)
    except (ModelvecError, OSError):  # an unreadable cache is no heat map, not a failed report
        return None
    return str(folder) if folder is not None and folder.is_dir() else None


def _per_block(
    X: np.ndarray, labels: list[list[str]], files: str | None, representation: Representation, scoring: Scoring
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The kNN score of each block alone (the blocks laid out from the base's files), or why there is none. Blocks
    that are zeros in every vector (the head's, where no model has one; a layer no model changed) are left out."""
    if files is None:
        return (
            None,
            "no per-block scores: the base's files are not on this machine (nor in the Hub cache, HF_HUB_CACHE)",
        )
    try:
        blocks = blocks_of(files, representation)
    except ModelvecError as exc:
        return None, f"no per-block scores: the base's files could not be laid out ({exc})"
    if not blocks or blocks[-1].stop != X.shape[1]:
        return None, "no per-block scores: the stored vectors do not match the base's layout"
    blocks = [b for b in blocks if X[:, b.start : b.stop].any()]  # a block no model has (a head) scores nothing
    bounds = [(b.start, b.stop) for b in blocks]
    scores = block_knn_scores(X, labels, bounds, metric=scoring.metric, scaling=scoring.scaling)
    return [
        {"stack": b.stack, "layer": b.layer, "family": b.family, "knn_score": float(v)} for b, v in zip(blocks, scores)
    ], None


def load_base(
    store: Store, base: PathLike | str, representation: Representation
) -> tuple[np.ndarray, pd.DataFrame, str]:
    """The stored vectors of ``base`` (a path or a stored id) under ``representation``; clear error when none."""
    ids = [str(base), model_id(base)] if os.path.exists(str(base)) else [str(base), resolve_base(str(base)).canonical]
    for name in ids:
        X, meta = store.load(base=name, representation=representation)
        if len(meta):
            return X, meta, name
    stored = store.summary()
    known = "; ".join(
        f"{b} [{p}: {options_of(s)}]" for b, p, s in zip(stored["base"], stored["params"], stored["settings"])
    )
    raise NothingStoredError(
        str(base),
        f"no vectors stored for this base with representation {representation.key()} "
        + (f"(stored, with the options that read them: {known}); or embed again" if known else "(nothing stored)"),
    )


#: From this many models ``reduce="auto"`` draws UMAP; below, t-SNE (UMAP's numba code compiles for ~15 s on
#: every run, while the map of a hundred models is as readable with t-SNE, in under a second).
AUTO_UMAP_FROM = 101
REDUCERS = ("auto", *METHODS)


def choose_reducer(n_models: int) -> tuple[str, str]:
    """The reduction ``auto`` draws for ``n_models``, and the line that says why."""
    if n_models >= AUTO_UMAP_FROM:
        return "umap", f"umap: {n_models} models"
    return "tsne", f"t-SNE for {n_models} models (UMAP compiles for ~15 s on every run; --reduce umap draws it)"


def cluster(
    base: PathLike | str,
    *,
    representation: Representation | None = None,
    scoring: Scoring | None = None,
    store: Store | PathLike | None = None,
    out: PathLike = "modelvec-out",
    reduce: str = "auto",
    standardize: bool = False,
    seed: int = 0,
    label_sources: Sequence[str] | None = None,
    settings: HubSettings | None = None,
) -> ClusterReport:
    """Score and map the stored vectors of ``base``; writes ``out/clusters-<reduce>.png`` and ``.html``.

    ``representation`` says which stored vectors (default: today's defaults); ``scoring`` how neighbours are
    found and counted (:class:`~modelvec.analyse.scores.Scoring`: its ``scaling`` ranks neighbours for the
    neighbour-based scores: ``"auto"``, the default, ranks by mutual proximity where the stored models mix LoRA
    adapters and full fine-tunes; the clusterers and the map see the vectors as they are). ``reduce`` is the map's reduction (umap, tsne, pca; auto:
    t-SNE below :data:`AUTO_UMAP_FROM` models, UMAP from there).
    ``label_sources`` keeps only labels from those sources (``card``, ``model-index``, ``tag``,
    ``name``, or ``declared`` / ``guessed`` / ``none``): other models count as unlabelled.
    The report also gives the kNN score with same-author neighbours excluded, to tell an author
    effect (one uploader's near-identical runs) from a dataset effect. A Hub base's per-block scores need its
    headers from the Hub cache (``settings``: where it is; nothing is fetched).
    """
    if reduce not in REDUCERS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCERS)}, not {reduce!r}")
    representation = representation or Representation()
    scoring = scoring or Scoring()
    with opened(store, read_only=True) as db:
        X, meta, base_name = load_base(db, base, representation)
        base_sha = db.base_sha(base_name) if is_hub_id(base_name) else None
    metric, pool = scoring.metric, scoring.pool
    scaling, scaling_note = scoring.scaling_for(meta["adapter"])
    labels = [list(d) for d in meta["datasets"]]
    if label_sources is not None:
        labels = [
            lab if matches_source(src if isinstance(src, str) else None, label_sources) else []
            for lab, src in zip(labels, meta["label_source"])
        ]
        meta = meta.assign(datasets=labels)
    geo = Geometry(X, metric)  # the vectors compared once, for every score below
    knn = knn_dataset_score(geo, labels, metric=metric, pool=pool, scaling=scaling)
    authors = [a if isinstance(a, str) and a else None for a in meta["author"]]
    by_author = knn_dataset_score(geo, labels, metric=metric, pool=pool, exclude_same=authors, scaling=scaling)
    counts = pd.Series([a for a in authors if a]).value_counts()
    pred = predict_datasets(geo, labels, k=scoring.k, metric=metric, scaling=scaling)
    scores = clustering_scores(geo, labels, metric=metric, seed=seed)
    predictions = [
        {"model": m, "predicted": p, "confidence": float(c), "vote_share": float(v), "closeness": float(n)}
        for m, p, c, v, n in zip(meta["model"], pred.predicted, pred.confidence, pred.vote_share, pred.closeness)
        if p is not None
    ]
    report = ClusterReport(
        base=base_name,
        params=representation.key(),
        n_models=len(meta),
        metric=metric,
        pool=pool,
        knn_score=knn.score,
        n_scored=knn.n_scored,
        per_dataset={d: {"score": s, "count": n} for d, (s, n) in knn.per_dataset.items()},
        loo_accuracy=pred.loo_accuracy,
        clustering=scores,
        predictions=predictions,
        knn_score_other_authors=by_author.score,
        n_scored_other_authors=by_author.n_scored,
        n_authors=len(counts),
        largest_author_share=float(counts.iloc[0] / len(meta)) if len(counts) else float("nan"),
        label_sources=list(label_sources) if label_sources is not None else None,
        scaling=scaling,
        scaling_note=scaling_note,
        k=scoring.k,
    )
    folder = Path(out)
    files = _base_files(base_name, base_sha, settings or HubSettings())
    resolved = replace(scoring, scaling=scaling)
    report.per_block, report.per_block_note = _per_block(X, labels, files, representation, resolved)
    if report.per_block:
        report.files["blocks"] = str(
            plot_block_scores(
                pd.DataFrame(report.per_block),
                folder / "blocks-knn.png",
                title=f"which layers and families separate the datasets ({representation.key()})",
            )
        )
    note = None
    if reduce == "auto":
        reduce, note = choose_reducer(len(meta))
    report.reduce, report.reduce_note = reduce, note
    if len(meta) >= 3:
        coords = reduce_to_2d(X, reduce, standardize=standardize, seed=seed, metric=metric)
        title = f"{len(meta)} fine-tunes of {display_name(base_name)}"
        subtitle = (
            f"{representation.key()} · {reduce.upper()} · kNN dataset score {knn.score:.2f} ({knn.n_scored} scored)"
        )
        report.files["png"] = str(
            plot_png(coords, meta, folder / f"clusters-{reduce}.png", method=reduce, title=title, subtitle=subtitle)
        )
        report.files["html"] = str(
            plot_html(coords, meta, folder / f"clusters-{reduce}.html", method=reduce, title=f"{title} — {subtitle}")
        )
    return report
