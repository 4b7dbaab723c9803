"""The cluster report: one base's stored vectors scored against their dataset labels and mapped.

``cluster`` reads the vectors of one base and representation from the store, computes the kNN
dataset score, predictions for unlabelled models and the clustering scores, reduces the vectors to
2-D, and writes a PNG and a self-contained HTML page. ``neighbors`` lists the stored models nearest
to a model, stored or not (a model not in the store is embedded on the fly with the stored
representation against the stored base, and not stored), and the dataset their labels suggest.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .analysis import clustering_scores, knn_dataset_score, majority_dataset, nearest, predict_datasets
from .hub import HubSettings, resolve_base
from .labels import matches_source
from .maps import reduce
from .pipeline import catalogue_entries, display_name, embed, is_hub_id, model_id
from .plots import plot_html, plot_png
from .representation import Representation
from .store import Store

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

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "clustering"}
        out.update(self.clustering)
        return out


def load_base(store: Store, base: PathLike | str, params: Representation) -> tuple[np.ndarray, pd.DataFrame, str]:
    """The stored vectors of ``base`` (a path or a stored id) under ``params``; clear error when none."""
    ids = [str(base), model_id(base)] if os.path.exists(str(base)) else [str(base), resolve_base(str(base)).canonical]
    for name in ids:
        X, meta = store.load(base=name, params=params)
        if len(meta):
            return X, meta, name
    stored = store.summary()
    known = "; ".join(f"{b} [{p}]" for b, p in zip(stored["base"], stored["params"])) or "nothing stored"
    raise LookupError(f"{base}: no vectors stored for this base with representation {params.key()} (stored: {known})")


def cluster(
    base: PathLike | str,
    *,
    params: Representation | None = None,
    store: Store | PathLike | None = None,
    out: PathLike = "modelvec-out",
    method: str = "umap",
    standardize: bool = False,
    metric: str = "cosine",
    pool: str = "labelled",
    k: int = 5,
    seed: int = 0,
    label_sources: Sequence[str] | None = None,
) -> ClusterReport:
    """Score and map the stored vectors of ``base``; writes ``out/clusters-<method>.png`` and ``.html``.

    ``label_sources`` keeps only labels from those sources (``card``, ``model-index``, ``tag``,
    ``name``, or ``declared`` / ``guessed`` / ``none``): other models count as unlabelled.
    The report also gives the kNN score with same-author neighbours excluded, to tell an author
    effect (one uploader's near-identical runs) from a dataset effect.
    """
    params = params or Representation()
    own = not isinstance(store, Store)
    db = Store(store) if own else store
    try:
        X, meta, base_name = load_base(db, base, params)
    finally:
        if own:
            db.close()
    labels = [list(d) for d in meta["datasets"]]
    if label_sources is not None:
        labels = [lab if matches_source(src if isinstance(src, str) else None, label_sources) else []
                  for lab, src in zip(labels, meta["label_source"])]
        meta = meta.assign(datasets=labels)
    knn = knn_dataset_score(X, labels, metric=metric, pool=pool)
    authors = [a if isinstance(a, str) and a else None for a in meta["author"]]
    by_author = knn_dataset_score(X, labels, metric=metric, pool=pool, exclude_same=authors)
    counts = pd.Series([a for a in authors if a]).value_counts()
    pred = predict_datasets(X, labels, k=k, metric=metric)
    scores = clustering_scores(X, labels, metric=metric, seed=seed)
    predictions = [
        {"model": m, "predicted": p, "confidence": float(c)}
        for m, p, c in zip(meta["model"], pred.predicted, pred.confidence)
        if p is not None
    ]
    report = ClusterReport(
        base=base_name, params=params.key(), n_models=len(meta), metric=metric, pool=pool, knn_score=knn.score,
        n_scored=knn.n_scored, per_dataset={d: {"score": s, "count": n} for d, (s, n) in knn.per_dataset.items()},
        loo_accuracy=pred.loo_accuracy, clustering=scores, predictions=predictions,
        knn_score_other_authors=by_author.score, n_scored_other_authors=by_author.n_scored, n_authors=len(counts),
        largest_author_share=float(counts.iloc[0] / len(meta)) if len(counts) else float("nan"),
        label_sources=list(label_sources) if label_sources is not None else None,
    )
    if len(meta) >= 3:
        coords = reduce(X, method, standardize=standardize, seed=seed, metric=metric)
        folder = Path(out)
        title = f"{len(meta)} fine-tunes of {display_name(base_name)}"
        subtitle = f"{params.key()} · {method.upper()} · kNN dataset score {knn.score:.2f} ({knn.n_scored} scored)"
        report.files["png"] = str(plot_png(coords, meta, folder / f"clusters-{method}.png", method=method,
                                           title=title, subtitle=subtitle))
        report.files["html"] = str(plot_html(coords, meta, folder / f"clusters-{method}.html", method=method,
                                             title=f"{title} — {subtitle}"))
    return report


@dataclass
class Neighbors:
    """The stored models nearest to a query model, and the dataset their labels suggest for it."""

    query: str
    base: str
    params: str
    on_the_fly: bool  # the query was not in the store: embedded now with the stored settings, not stored
    nearest: pd.DataFrame  # model, distance, datasets, label_source, author; nearest first
    predicted: str | None  # the majority dataset of the k nearest labelled models (None: none labelled)
    confidence: float  # the predicted dataset's share of their votes; nan when nothing was predicted
    votes: dict[str, int] = field(default_factory=dict)
    warning: str | None = None  # e.g. the query was embedded against another revision of the base


def _stored_base(db: Store, base: PathLike | str | None, params: Representation) -> str:
    """The base to compare against: the one given, else the only base with vectors under ``params``."""
    if base is not None:
        names = [model_id(base)] if os.path.exists(str(base)) else [str(base), resolve_base(str(base)).canonical]
        for name in names:
            if not db.metadata(base=name, params=params).empty:
                return name
        raise LookupError(f"{base}: no vectors stored for this base with representation {params.key()}")
    bases = sorted(set(db.metadata(params=params)["base"]))
    if len(bases) != 1:
        known = ", ".join(bases) or "none"
        raise LookupError(f"the store holds vectors of {len(bases)} bases with representation {params.key()} "
                          f"({known}): name one with --base")
    return bases[0]


def _embed_query(model: PathLike | str, base: str, params: Representation, db: Store,
                 settings: HubSettings | None) -> tuple[np.ndarray, str | None]:
    """Embed a model that is not stored, in a scratch store, exactly as ``embed`` would store it.

    The scratch store gets the stored base revision and the model's catalogue entry, so a Hub
    base resolves to the revision the stored vectors were computed against.
    """
    name = model_id(model)
    with tempfile.TemporaryDirectory(prefix="modelvec-query-") as tmp, Store(Path(tmp) / "query.duckdb") as scratch:
        sha = db.base_sha(base)
        if sha is not None:
            scratch.put_catalogue(base, sha, catalogue_entries(db, base, kept=None, model=name) if is_hub_id(name) else [])
        result = embed(base, [model], representation=params, store=scratch, settings=settings, workers=1)
        if result.failed:
            raise LookupError(next(iter(result.failed.values())))
        base_hash = scratch.base_hashes(base, params)
    stored = db.base_hashes(base, params)
    warning = None
    if base_hash and stored and base_hash[0] not in stored:
        warning = (f"{name} was embedded against {base} as it is now ({base_hash[0]}), but the stored vectors "
                   f"were computed against {', '.join(stored)}: distances may include the base's change")
    return result.vectors[0], warning


def neighbors(
    model: PathLike | str,
    *,
    params: Representation | None = None,
    store: Store | PathLike | None = None,
    k: int = 10,
    metric: str = "cosine",
    base: PathLike | str | None = None,
    settings: HubSettings | None = None,
) -> Neighbors:
    """The ``k`` stored models nearest to ``model``, and the dataset they suggest for it.

    ``model`` is a stored model, or any local folder or Hub id: one not in the store is embedded
    on the fly with ``params`` against the stored base (``base``, or the only one stored) and
    compared, without being stored. The prediction is the majority dataset among the ``k``
    nearest labelled models (the rule of ``cluster``'s predictions), with its vote share.
    """
    params = params or Representation()
    own = not isinstance(store, Store)
    db = Store(store) if own else store
    try:
        name = model_id(model) if os.path.exists(str(model)) else str(model)
        rows = db.metadata(params=params, models=[name])
        if base is not None or rows.empty:
            base_name = _stored_base(db, base, params)
            rows = rows[rows["base"] == base_name]
        else:
            base_name = rows["base"].iloc[0]
        X, meta = db.load(base=base_name, params=params)
        on_the_fly, warning = rows.empty, None
        if on_the_fly:
            if not os.path.exists(str(model)) and not is_hub_id(model):
                raise LookupError(f"{model}: not in the store, and neither a local path nor a Hub id")
            query, warning = _embed_query(model, base_name, params, db, settings)
            me = None
        else:
            me = int(np.flatnonzero(meta["model"].to_numpy() == name)[0])
            query = X[me]
    finally:
        if own:
            db.close()
    idx, dist = nearest(X, query, k=k, metric=metric, exclude=me)
    found = meta.iloc[idx][["model", "datasets", "label_source", "author"]].reset_index(drop=True)
    found.insert(1, "distance", dist)
    labels = [list(d) for d in meta["datasets"]]
    labelled = np.array([i for i, d in enumerate(labels) if d and i != me], dtype=int)
    predicted, confidence, votes = None, float("nan"), {}
    if len(labelled):
        voters, _ = nearest(X[labelled], query, k=k, metric=metric)
        predicted, confidence, votes = majority_dataset([labels[i] for i in labelled[voters]])
    return Neighbors(name, base_name, params.key(), on_the_fly, found, predicted, confidence, votes, warning)
