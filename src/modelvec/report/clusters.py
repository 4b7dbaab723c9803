"""The cluster report: one base's stored vectors scored against their dataset labels and mapped.

``cluster`` reads the vectors of one base and representation from the store, computes the kNN
dataset score, predictions for unlabelled models and the clustering scores, reduces the vectors to
2-D, and writes a PNG and a self-contained HTML page.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyse.reduction import UMAP_KNOWN_FROM, UMAP_NEIGHBOURS, Reduction
from ..analyse.reduction import reduce as reduce_to_2d
from ..analyse.scores import (
    Geometry,
    Scoring,
    block_knn_scores,
    clustering_scores,
    coordinates_of,
    knn_dataset_score,
    predict_datasets,
)
from ..core.errors import ModelvecError, NothingStoredError
from ..core.files import weight_format
from ..core.names import display_name, is_hub_id, model_id
from ..core.settings import taken_from, with_options
from ..hub.client import HubSettings
from ..hub.download import snapshot_folder
from ..hub.ids import resolve_base
from ..hub.labels import matches_source
from ..hub.partial import partial_folder
from ..plots.blocks import plot_block_scores
from ..plots.maps import plot_html, plot_png
from ..represent import blocks_of
from ..represent.representation import Representation
from ..store import Selection, Store, opened, options_of
from .stored import kept_spread, products_key, stored_products

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
    #: stored vectors left out because their bytes do not match their checksum: model -> one line
    damaged: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "clustering"}
        out.update(self.clustering)
        return out


def _base_files(base: str, sha: str | None, hub_settings: HubSettings) -> str | None:
    """The base's files on this machine: its folder, or a Hub base's snapshot in the Hub cache, or the rows of it
    that embed fetched (never fetched here: only the headers are needed, and ``cluster`` works offline)."""
    if os.path.exists(base):
        return base
    if not is_hub_id(base):
        return None
    try:
        folder = snapshot_folder(base, sha or "main", hub_settings)
        if (folder is None or not weight_format(p.name for p in folder.iterdir())) and sha:
            folder = partial_folder(base, sha, hub_settings)
    except (ModelvecError, OSError):  # an unreadable cache is no heat map, not a failed report
        return None
    return str(folder) if folder is not None and folder.is_dir() else None


#: The per-block scores are computed on at most this many models (a sample spread over the datasets): each block's
#: own products would cost as much as all of them again.
BLOCK_SAMPLE = 1000


def _block_sample(
    db: Store, selection: Selection, kept: np.ndarray, meta: pd.DataFrame
) -> tuple[np.ndarray | None, np.ndarray]:
    """The vectors the per-block scores are computed on (all, up to :data:`BLOCK_SAMPLE` models; above, a seeded
    sample taken in turn from each dataset) and their rows of ``meta``."""
    n = len(kept)
    if n <= BLOCK_SAMPLE:
        rows = np.arange(n)
    else:
        rng = np.random.default_rng(0)
        groups: dict[str, list[int]] = {}
        for i, d in enumerate(meta["datasets"]):
            groups.setdefault(min(d) if len(d) else "", []).append(i)
        queues = [list(rng.permutation(g)) for _, g in sorted(groups.items())]
        picked: list[int] = []
        while len(picked) < BLOCK_SAMPLE:
            for q in queues:
                if q and len(picked) < BLOCK_SAMPLE:
                    picked.append(int(q.pop()))
        rows = np.sort(np.array(picked))
    at = kept[rows]
    X = db.vector_file.read(
        [selection.offsets[i] for i in at],
        selection.dim,
        [selection.hashes[i] for i in at],
        [selection.models[i] for i in at],
    )
    return X, rows


def _per_block(
    sample: tuple[np.ndarray | None, np.ndarray],
    labels: list[list[str]],
    files: str | None,
    representation: Representation,
    scoring: Scoring,
    n_models: int,
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The kNN score of each block alone (the blocks laid out from the base's files), or why there is none. Blocks
    that are zeros in every vector (the head's, where no model has one; a layer no model changed) are left out."""
    X, rows = sample
    if files is None or X is None:
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
    scores = block_knn_scores(X, [labels[i] for i in rows], bounds, metric=scoring.metric, scaling=scoring.scaling)
    return [
        {"stack": b.stack, "layer": b.layer, "family": b.family, "knn_score": float(v)} for b, v in zip(blocks, scores)
    ], None


def select_base(
    store: Store, base: PathLike | str, representation: Representation
) -> tuple[Selection, pd.DataFrame, str]:
    """Where the stored vectors of ``base`` (a path or a stored id) under ``representation`` are, their metadata and
    the base's stored name (no vector read); a clear error when there are none."""
    ids = [str(base), model_id(base)] if os.path.exists(str(base)) else [str(base), resolve_base(str(base)).canonical]
    for name in ids:
        selection, meta = store.select(base=name, representation=representation)
        if len(meta):
            return selection, meta, name
    stored = store.summary()
    known = "; ".join(
        f"{b} [{p}: {options_of(s)}]" for b, p, s in zip(stored["base"], stored["params"], stored["params_json"])
    )
    raise NothingStoredError(
        str(base),
        f"no vectors stored for this base with representation {representation.key()} "
        + (f"(stored, with the options that read them: {known}); or embed again" if known else "(nothing stored)"),
    )


def load_base(
    store: Store, base: PathLike | str, representation: Representation
) -> tuple[np.ndarray, pd.DataFrame, str]:
    """The stored vectors of ``base`` as one matrix (for a few hundred; ``cluster`` reads products instead)."""
    selection, meta, name = select_base(store, base, representation)
    return store.vector_file.read(selection.offsets, selection.dim, selection.hashes, selection.models), meta, name


def cluster(
    base: PathLike | str,
    *,
    representation: Representation | None = None,
    scoring: Scoring | None = None,
    store: Store | PathLike | None = None,
    reduction: Reduction | None = None,
    out: PathLike = "modelvec-out",
    seed: int = 0,
    label_sources: Sequence[str] | None = None,
    hub_settings: HubSettings | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> ClusterReport:
    """Score and map the stored vectors of ``base``; writes ``out/clusters-<reduce>.png`` and ``.html``.

    ``representation`` says which stored vectors (default: today's defaults); ``scoring`` how neighbours are
    found and counted (:class:`~modelvec.analyse.scores.Scoring`: its ``scaling`` ranks neighbours for the
    neighbour-based scores: ``"auto"``, the default, ranks by mutual proximity where the stored models mix LoRA
    adapters and full fine-tunes; the clusterers and the map see the vectors as they are). ``reduction`` how the map
    is drawn (:class:`~modelvec.analyse.reduction.Reduction`). The settings of both may also be given one by one:
    ``reduce="pca", k=3``.
    ``label_sources`` keeps only labels from those sources (``card``, ``model-index``, ``tag``, ``name``, or
    ``declared`` / ``guessed`` / ``none``): other models count as unlabelled. The report also gives the kNN score
    with same-author neighbours excluded (an author effect is not a dataset effect). A Hub base's per-block scores
    need its headers from the Hub cache (``hub_settings``; nothing is fetched); the map draws the model tree's edges.

    The vectors are never held: their inner products are read from the vector file in blocks and kept beside the
    store (a later run computes only new vectors'; ``progress(done, total)``); a damaged vector is ``report.damaged``.
    """
    scoring = with_options(Scoring, scoring, taken_from(Scoring, options), "cluster")
    reduction = with_options(Reduction, reduction, options, "cluster")
    representation = representation or Representation()
    with opened(store, read_only=True) as db:
        selection, meta, base_name = select_base(db, base, representation)
        base_sha = db.base_sha(base_name) if is_hub_id(base_name) else None
        key = products_key(base_name, representation)
        products, meta = stored_products(db, selection, meta, key, progress)
        sample = _block_sample(db, selection, products.kept, meta)
        geo = Geometry.from_products(products.gram, scoring.metric)
        scaling = scoring.scaling_for(meta["adapter"])[0]
        kept_spread(db, [selection.hashes[i] for i in products.kept], key, geo, scaling)
        standardized = (
            db.products(selection, cache=products_key(base_name, representation, "standardized"), standardize=True)
            if reduction.standardize and len(meta) >= 3
            else None
        )
        edges = _tree_edges(db, base_name, representation, meta)
    labels = [list(d) for d in meta["datasets"]]
    if label_sources is not None:
        labels = [
            lab if matches_source(src if isinstance(src, str) else None, label_sources) else []
            for lab, src in zip(labels, meta["label_source"])
        ]
        meta = meta.assign(datasets=labels)
    reduce, note = reduction.reducer_for(len(meta))
    if standardized is not None:
        coordinates = coordinates_of(standardized.gram)
    elif reduce != "umap":  # PCA (and t-SNE's PCA start) of the vectors as they are, not of unit vectors
        coordinates = coordinates_of(products.gram)
    else:  # UMAP sees cosine distances, the same from unit vectors: the geometry's coordinates, made once for both
        coordinates = None
    report = _scores(geo, meta, labels, base_name, representation, scoring, seed, label_sources)
    report.damaged = products.damaged
    folder = Path(out)
    files = _base_files(base_name, base_sha, hub_settings or HubSettings())
    resolved = replace(scoring, scaling=report.scaling)
    report.per_block, report.per_block_note = _per_block(sample, labels, files, representation, resolved, len(meta))
    if report.per_block:
        title = f"which layers and families separate the datasets ({representation.key()})"
        if sample[0] is not None and len(sample[0]) < len(meta):
            title += f"; a sample of {len(sample[0]):,} of {len(meta):,} models"
        report.files["blocks"] = str(
            plot_block_scores(pd.DataFrame(report.per_block), folder / "blocks-knn.png", title=title)
        )
    report.reduce, report.reduce_note = reduce, note
    _draw(report, coordinates, meta, folder, seed, geo, representation, edges)
    return report


#: Models up to which the map draws the model tree's edges (the tree is a pass over every pair of traces).
TREE_EDGES_UP_TO = 4000


def _tree_edges(db: Store, base: str, representation: Representation, meta: pd.DataFrame) -> list[tuple[int, int]]:
    """The model tree's edges between mapped models, as (child, parent) rows of ``meta``: none without traces or
    above :data:`TREE_EDGES_UP_TO` models."""
    if len(meta) > TREE_EDGES_UP_TO or len(meta) < 2:
        return []
    from .tree import model_tree

    try:
        tree = model_tree(base, representation=representation, store=db)
    except NothingStoredError:
        return []
    row = {m: i for i, m in enumerate(meta["model"])}
    return [(row[n.model], row[p]) for n in tree.nodes for p in n.parents if n.model in row and p in row]


def _scores(
    geo: Geometry,
    meta: pd.DataFrame,
    labels: list[list[str]],
    base_name: str,
    representation: Representation,
    scoring: Scoring,
    seed: int,
    label_sources: Sequence[str] | None,
) -> ClusterReport:
    """Every score of the report, from the vectors' geometry."""
    metric, pool = scoring.metric, scoring.pool
    scaling, scaling_note = scoring.scaling_for(meta["adapter"])
    knn = knn_dataset_score(geo, labels, metric=metric, pool=pool, scaling=scaling)
    authors = [a if isinstance(a, str) and a else None for a in meta["author"]]
    by_author = knn_dataset_score(geo, labels, metric=metric, pool=pool, exclude_same=authors, scaling=scaling)
    counts = pd.Series([a for a in authors if a]).value_counts()
    pred = predict_datasets(geo, labels, k=scoring.k, metric=metric, scaling=scaling)
    predictions = [
        {"model": m, "predicted": p, "confidence": float(c), "vote_share": float(v), "closeness": float(n)}
        for m, p, c, v, n in zip(meta["model"], pred.predicted, pred.confidence, pred.vote_share, pred.closeness)
        if p is not None
    ]
    return ClusterReport(
        base=base_name,
        params=representation.key(),
        n_models=len(meta),
        metric=metric,
        pool=pool,
        knn_score=knn.score,
        n_scored=knn.n_scored,
        per_dataset={d: {"score": s, "count": n} for d, (s, n) in knn.per_dataset.items()},
        loo_accuracy=pred.loo_accuracy,
        clustering=clustering_scores(geo, labels, metric=metric, seed=seed),
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


def _draw(
    report: ClusterReport,
    coordinates: np.ndarray | None,
    meta: pd.DataFrame,
    folder: Path,
    seed: int,
    geo: Geometry,
    representation: Representation,
    edges: list[tuple[int, int]],
) -> None:
    """The map (PNG and HTML), from the vectors' coordinates: the same inner products as the vectors (and UMAP's
    nearest neighbours, on thousands of models, from them: :data:`~modelvec.analyse.reduction.UMAP_KNOWN_FROM`)."""
    reduce = report.reduce
    if len(meta) < 3:
        return
    coordinates = geo.coordinates() if coordinates is None else coordinates
    known = geo.neighbours(UMAP_NEIGHBOURS + 1) if reduce == "umap" and len(meta) >= UMAP_KNOWN_FROM else None
    coords = reduce_to_2d(coordinates, reduce, seed=seed, metric=geo.metric, neighbours=known)
    title = f"{len(meta)} fine-tunes of {display_name(report.base)}"
    subtitle = f"{representation.key()} · {reduce.upper()} · kNN dataset score {report.knn_score:.2f} ({report.n_scored} scored)"
    report.files["png"] = str(
        plot_png(coords, meta, folder / f"clusters-{reduce}.png", reducer=reduce, title=title, subtitle=subtitle)
    )
    report.files["html"] = str(
        plot_html(
            coords, meta, folder / f"clusters-{reduce}.html", reducer=reduce, title=f"{title} — {subtitle}", edges=edges
        )
    )
