"""The cluster report: one base's stored vectors scored against their dataset labels and mapped.

``cluster`` reads the vectors of one base and representation from the store, computes the kNN
dataset score, predictions for unlabelled models and the clustering scores, reduces the vectors to
2-D, and writes a PNG and a self-contained HTML page.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyse.clustering import clustering_scores
from ..analyse.layout import taken_notes
from ..analyse.parallel import one_blas_thread
from ..analyse.reduction import UMAP_KNOWN_FROM, UMAP_NEIGHBOURS, Reduction
from ..analyse.reduction import reduce as reduce_to_2d
from ..analyse.scores import (
    Geometry,
    Scoring,
    block_knn_scores,
    coordinates_of,
    knn_dataset_score,
    predict_datasets,
)
from ..analyse.tree import Tree
from ..core.errors import ModelvecError, NothingStoredError
from ..core.names import display_name
from ..core.settings import taken_from, with_options
from ..hub.client import HubSettings
from ..hub.labels import matches_source
from ..plots.blocks import plot_block_scores
from ..plots.maps import plot_html, plot_png
from ..represent import blocks_of
from ..represent.representation import Representation
from ..store import Population, Store, opened
from ..store.products import Compute, Products

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
    #: the population's version of the base (``base_hash``), its vectors embedded against earlier versions
    #: (``stale``, left out) and its models whose weights are the base's (``copies``, left out)
    population: dict[str, Any] = field(default_factory=dict)
    #: what the population left out and why (stale vectors, copies of the base): one line each
    notes: list[str] = field(default_factory=list)
    #: kept files that did not verify and were computed again: one line each (said on stderr, not part of the answer)
    repaired: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("clustering", "repaired")}
        out.update(self.clustering)
        return out


#: The per-block scores are computed on at most this many models (a sample spread over the datasets): each block's
#: own products would cost as much as all of them again, and each block's mutual proximity grows as the square of
#: the sample (224 blocks of an 8B base at 1,000 models took 6.7 s of a 10,000-model `cluster`'s 21 s).
BLOCK_SAMPLE = 500


#: The per-block scores' code: kept scores are read only where they were computed by the same (raise it when the
#: scores change what they give for the same vectors and labels).
PER_BLOCK_VERSION = 1


def _block_sample(pop: Population, kept: np.ndarray, meta: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
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
    return pop.rows(kept[rows]), rows


def _per_block(
    pop: Population,
    products: Products,
    meta: pd.DataFrame,
    files: str | None,
    scoring: Scoring,
) -> tuple[list[dict[str, Any]] | None, str | None, int]:
    """The kNN score of each block alone (the blocks laid out from the base's files), or why there is none, and how
    many models it was computed on. Blocks that are zeros in every vector (the head's, where no model has one; a
    layer no model changed) are left out. Kept beside the store for exactly these vectors, labels and blocks
    (:meth:`~modelvec.store.Population.derived`): computed only where none is kept."""
    if files is None:
        return (
            None,
            "no per-block scores: the base's files are not on this machine (nor in the Hub cache, HF_HUB_CACHE)",
            0,
        )
    try:
        blocks = blocks_of(files, pop.representation)
    except ModelvecError as exc:
        return None, f"no per-block scores: the base's files could not be laid out ({exc})", 0
    if not blocks or blocks[-1].stop != pop.selection.dim:
        return None, "no per-block scores: the stored vectors do not match the base's layout", 0

    def computed() -> dict[str, np.ndarray]:
        X, rows = _block_sample(pop, products.positions, meta)
        labels = [list(meta["datasets"].iloc[i]) for i in rows]
        live = [i for i, b in enumerate(blocks) if X[:, b.start : b.stop].any()]  # a block no model has scores nothing
        bounds = [(blocks[i].start, blocks[i].stop) for i in live]
        scores = block_knn_scores(X, labels, bounds, metric=scoring.metric, scaling=scoring.scaling)
        return {"blocks": np.array(live, np.int64), "scores": scores, "sampled": np.array([len(X)], np.int64)}

    inputs = json.dumps(
        [
            PER_BLOCK_VERSION,
            BLOCK_SAMPLE,
            [sorted(d) for d in meta["datasets"]],
            [[b.stack, b.layer, b.family, b.start, b.stop] for b in blocks],
        ]
    )
    name = f"blocks-{scoring.metric}-{scoring.scaling}"
    kept = pop.derived(products, name, computed, inputs=hashlib.sha256(inputs.encode()).hexdigest())
    found = [
        {"stack": blocks[i].stack, "layer": blocks[i].layer, "family": blocks[i].family, "knn_score": float(v)}
        for i, v in zip(kept["blocks"].tolist(), kept["scores"])
    ]
    return found, None, int(kept["sampled"][0])


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
    compute: Compute | None = None,
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
    need its headers from the Hub cache (``hub_settings``; nothing is fetched); the HTML map shows the model tree
    (kinds, parents and children) where traces are stored.

    The models are the base's :class:`~modelvec.store.Population`: those embedded against the base as it is now,
    copies of the base left out (``report.population``, ``report.notes``). The vectors are not held whole: their
    inner products are read from the vector file in blocks and kept beside the store, verified (a later run computes
    only new vectors'; ``progress(done, total)``); a damaged vector is ``report.damaged``; the per-block scores read
    a sample of at most :data:`BLOCK_SAMPLE` vectors. ``compute`` says where their float32 products run
    (:class:`~modelvec.store.products.Compute`: ``device="auto"``, a GPU where one is visible).
    """
    scoring = with_options(Scoring, scoring, taken_from(Scoring, options), "cluster")
    compute = with_options(Compute, compute, taken_from(Compute, options), "cluster")
    reduction = with_options(Reduction, reduction, options, "cluster")
    with ExitStack() as stack, opened(store, read_only=True) as db, ThreadPoolExecutor(1) as beside:
        beside.submit(_import_ahead)
        pop = Population(db, base, representation)
        products, meta = pop.products(progress, device=compute.device)
        if label_sources is not None:
            meta = meta.assign(
                datasets=[
                    list(lab) if matches_source(src if isinstance(src, str) else None, label_sources) else []
                    for lab, src in zip(meta["datasets"], meta["label_source"])
                ]
            )
        resolved, scaling_note = pop.resolve(scoring, list(meta["adapter"]))
        stack.enter_context(one_blas_thread())  # what follows the products: small LAPACK calls, row blocks on threads
        geo = pop.geometry(products, resolved)
        standardized = pop.standardized() if reduction.standardize and len(meta) >= 3 else None
        reduce, note = reduction.reducer_for(len(meta))
        layout = beside.submit(_kept_layout, pop, products, standardized, geo, reduce, seed)  # beside the scores
        pop.rank_all(geo, products, resolved.scaling)  # every pair's mutual proximity, kept beside the store
        tree = _map_tree(pop, meta)
        report = _scores(geo, meta, pop, resolved, seed, label_sources)
        report.scaling_note = scaling_note
        files = pop.base_files(hub_settings or HubSettings())
        report.per_block, report.per_block_note, sampled = _per_block(pop, products, meta, files, resolved)
        xy = layout.result()
    report.damaged, report.population = dict(pop.damaged), pop.describe()
    report.notes, report.repaired = pop.left_out(), [*pop.repaired, *taken_notes()]
    folder = Path(out)
    if report.per_block:
        title = f"which layers and families separate the datasets ({pop.representation.key()})"
        if sampled < len(meta):
            title += f"; a sample of {sampled:,} of {len(meta):,} models"
        report.files["blocks"] = str(
            plot_block_scores(pd.DataFrame(report.per_block), folder / "blocks-knn.png", title=title)
        )
    report.reduce, report.reduce_note = reduce, note
    _draw(report, xy, meta, folder, pop.representation, tree)
    return report


#: What the scores and the figures import when first used (about 1.3 s on 2 cores): imported on the thread beside
#: while the store is read and its vectors checked, which wait on the disk and run outside Python's lock.
AHEAD = (
    "scipy.linalg",
    "numba",
    "sklearn.cluster",
    "sklearn.metrics",
    "sklearn.utils.extmath",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "plotly.graph_objects",
)


def _import_ahead() -> None:
    """Import :data:`AHEAD`; one that fails is left to fail where it is used, with its own message."""
    for name in AHEAD:
        try:
            importlib.import_module(name)
        except Exception:  # said where it is imported again, by the step that needs it
            pass


def _map_tree(pop: Population, meta: pd.DataFrame) -> Tree | None:
    """The model tree the HTML map shows (its kinds, each model's parents and children, what the cards declare), at
    any size: None for fewer than two models, or where the store holds no traces (a map without a tree, no error)."""
    if len(meta) < 2:
        return None
    from .tree import tree_of

    try:
        return tree_of(pop)
    except NothingStoredError:
        return None


def _scores(
    geo: Geometry,
    meta: pd.DataFrame,
    pop: Population,
    scoring: Scoring,
    seed: int,
    label_sources: Sequence[str] | None,
) -> ClusterReport:
    """Every score of the report, from the vectors' geometry (``scoring`` resolved: its scaling is not ``auto``)."""
    labels = [list(d) for d in meta["datasets"]]
    metric, pool, scaling = scoring.metric, scoring.pool, scoring.scaling
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
        base=pop.name,
        params=pop.representation.key(),
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
        k=scoring.k,
    )


#: The map's layout code: a kept layout is used only where it was made by the same (raise it when the reductions
#: change what they give for the same coordinates).
MAP_VERSION = 2


def _layout_version() -> str:
    """What a kept map was laid out by: :data:`MAP_VERSION` and the versions of the libraries that lay maps out."""
    from importlib.metadata import version

    return f"v{MAP_VERSION}-numba{version('numba')}-sklearn{version('scikit-learn')}"


def _kept_layout(
    pop: Population, products: Products, standardized: Products | None, geo: Geometry, reduce: str, seed: int
) -> np.ndarray | None:
    """The map's 2-D layout (None: fewer than three models, no map), kept beside the store for exactly these
    vectors (:meth:`~modelvec.store.Population.derived`): laid out only where none is kept, on a thread beside the
    scores. From the vectors' coordinates: the same inner products as the vectors, standardised where asked; PCA
    (and t-SNE's PCA start) of the vectors as they are, UMAP of the geometry's (cosine distances are the same from
    unit vectors), with its nearest neighbours from them on thousands of models
    (:data:`~modelvec.analyse.reduction.UMAP_KNOWN_FROM`)."""
    if len(geo) < 3:
        return None

    def laid_out() -> dict[str, np.ndarray]:
        if standardized is not None:
            coordinates = coordinates_of(standardized.gram)
        elif reduce != "umap":
            coordinates = coordinates_of(products.gram)
        else:
            coordinates = geo.coordinates()
        known = geo.neighbours(UMAP_NEIGHBOURS + 1) if reduce == "umap" and len(geo) >= UMAP_KNOWN_FROM else None
        return {"xy": reduce_to_2d(coordinates, reduce, seed=seed, metric=geo.metric, neighbours=known)}

    kind = "-standardized" if standardized is not None else ""
    return pop.derived(products, f"map-{reduce}-{geo.metric}-{seed}{kind}-{_layout_version()}", laid_out)["xy"]


def _draw(
    report: ClusterReport,
    coords: np.ndarray | None,
    meta: pd.DataFrame,
    folder: Path,
    representation: Representation,
    tree: Tree | None,
) -> None:
    """The map (PNG and HTML) of the layout ``coords`` (None: fewer than three models, no map)."""
    reduce = report.reduce
    if coords is None:
        return
    title = f"{len(meta)} fine-tunes of {display_name(report.base)}"
    subtitle = f"{representation.key()} · {reduce.upper()} · kNN dataset score {report.knn_score:.2f} ({report.n_scored} scored)"
    report.files["png"] = str(
        plot_png(coords, meta, folder / f"clusters-{reduce}.png", reducer=reduce, title=title, subtitle=subtitle)
    )
    report.files["html"] = str(
        plot_html(
            coords, meta, folder / f"clusters-{reduce}.html", reducer=reduce, title=f"{title} — {subtitle}", tree=tree
        )
    )
