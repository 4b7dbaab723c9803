"""The cluster report: one base's stored vectors scored against their dataset labels and mapped.

``cluster`` reads the vectors of one base and representation from the store, computes the kNN
dataset score, predictions for unlabelled models and the clustering scores, reduces the vectors to
2-D, and writes a PNG and a self-contained HTML page.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyse.clustering import clustering_scores
from ..analyse.parallel import one_blas_thread
from ..analyse.reduction import UMAP_KNOWN_FROM, UMAP_NEIGHBOURS, Reduction
from ..analyse.reduction import reduce as reduce_to_2d
from ..analyse.scores import (
    Geometry,
    KnnScore,
    Predictions,
    Scoring,
    coordinates_of,
    knn_dataset_score,
    predict_datasets,
)
from ..analyse.umap_style import kept_code_note
from ..core.errors import ModelvecError
from ..core.settings import taken_from, with_options
from ..hub.client import HubSettings
from ..hub.labels import matches_source
from ..represent.representation import Representation
from ..run.engines import Execution
from ..store import Population, Store, opened
from ..store.derived.neighbours import TaskRunner
from ..store.derived.products import Compute, Products
from . import cluster_parts as parts
from .cluster_parts import ClusterReport

PathLike = str | os.PathLike[str]


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
    execution: Execution | None = None,
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

    The models are the base's :class:`~modelvec.store.Population`: those embedded against the base as it is now, copies
    of the base left out (``report.population``, ``report.notes``). The vectors are not held whole: their inner products
    are read from the vector file in blocks and kept beside the store, verified (a later run computes only new vectors';
    ``progress(done, total)``); a damaged vector is ``report.damaged``; the per-block scores read a sample of at most
    :data:`BLOCK_SAMPLE` vectors. ``compute`` says where their float32 products run
    (:class:`~modelvec.store.derived.products.Compute`: ``device="auto"``, a GPU where one is visible) and whether the
    scores read every pair's products or each model's nearest lists (``neighbours``: lists above
    :data:`~modelvec.store.derived.products.PAIRS_UP_TO` models, :mod:`~modelvec.report.lists`); ``execution``'s
    ``engine`` ``"ray"`` runs the lists' pass as tasks on a Ray cluster (:mod:`~modelvec.run.ray_blocks`; its
    ``address`` and ``workers``).
    """
    scoring = with_options(Scoring, scoring, taken_from(Scoring, options), "cluster")
    compute = with_options(Compute, compute, taken_from(Compute, options), "cluster")
    reduction = with_options(Reduction, reduction, taken_from(Reduction, options), "cluster")
    execution = with_options(Execution, execution, options, "cluster")
    with ExitStack() as stack, opened(store, read_only=True) as db, ThreadPoolExecutor(1) as beside:
        beside.submit(parts.import_ahead)
        pop = Population(db, base, representation)
        on_lists = compute.neighbours_for(len(pop.selection)) == "lists"
        if on_lists and reduction.standardize:
            raise ModelvecError(pop.name, STANDARDIZE_ON_LISTS)
        products, meta = (None, pop.meta) if on_lists else pop.products(progress, device=compute.device)
        meta = _from_sources(meta, label_sources)
        resolved, scaling_note = pop.resolve(scoring, list(meta["adapter"]))
        reduce, note = reduction.reducer_for(len(meta))
        if on_lists:
            where = (_runner(execution), compute.device)
            drawn = (reduce, seed)
            report, xy, meta, positions = _scored_on_lists(
                pop, meta, resolved, drawn, label_sources, stack, where, progress
            )
        else:
            assert products is not None
            report, xy, positions = _scored_on_pairs(
                pop, products, meta, resolved, reduction, seed, label_sources, stack, beside
            )
        tree = parts.map_tree(pop, meta)
        report.scaling_note = scaling_note
        files = pop.base_files(hub_settings or HubSettings())
        report.per_block, report.per_block_note, sampled = parts.per_block(pop, positions, meta, files, resolved)
    report.damaged, report.population = dict(pop.damaged), pop.describe()
    report.notes, report.repaired = pop.left_out(), [*pop.repaired, *_layout_notes(reduce)]
    folder = Path(out)
    parts.draw_blocks(report, folder, pop.representation, sampled, len(meta))
    report.reduce, report.reduce_note = reduce, note
    parts.draw(report, xy, meta, folder, pop.representation, tree)
    return report


def _layout_notes(reduce: str) -> list[str]:
    """What a UMAP map's layout says of numba's kept code (:func:`~modelvec.analyse.umap_style.kept_code_note`)."""
    note = kept_code_note() if reduce == "umap" else None
    return [note] if note else []


def _scored_on_pairs(
    pop: Population,
    products: Products,
    meta: pd.DataFrame,
    scoring: Scoring,
    reduction: Reduction,
    seed: int,
    label_sources: Sequence[str] | None,
    stack: ExitStack,
    beside: ThreadPoolExecutor,
) -> tuple[ClusterReport, np.ndarray | None, np.ndarray]:
    """The report's scores and map from every pair's products (``scoring`` resolved), the map laid out on the
    thread ``beside`` the scores; and the positions they cover."""
    stack.enter_context(one_blas_thread())  # what follows the products: small LAPACK calls, row blocks on threads
    geo = pop.geometry(products, scoring)
    standardized = pop.standardized() if reduction.standardize and len(meta) >= 3 else None
    reduce, _ = reduction.reducer_for(len(meta))
    layout = beside.submit(_kept_layout, pop, products, standardized, geo, reduce, seed)  # beside the scores
    pop.rank_all(geo, products, scoring.scaling)  # every pair's mutual proximity, kept beside the store
    report = _report(pop, meta, scoring, label_sources, *_scores(geo, meta, scoring, seed))
    return report, layout.result(), products.positions


#: Why ``--standardize`` is refused where the scores read nearest lists.
STANDARDIZE_ON_LISTS = (
    "--standardize needs every pair's products of the standardised vectors, which are not computed above "
    "16,384 models (each model's nearest lists are): leave it out, or --neighbours pairs where they fit"
)


def _from_sources(meta: pd.DataFrame, label_sources: Sequence[str] | None) -> pd.DataFrame:
    """``meta`` with only the labels from ``label_sources`` (None: all of them)."""
    if label_sources is None:
        return meta
    return meta.assign(
        datasets=[
            list(lab) if matches_source(src if isinstance(src, str) else None, label_sources) else []
            for lab, src in zip(meta["datasets"], meta["label_source"])
        ]
    )


def _scores(
    geo: Geometry, meta: pd.DataFrame, scoring: Scoring, seed: int
) -> tuple[KnnScore, KnnScore, Predictions, dict[str, float]]:
    """Every score of the report from the vectors' geometry (``scoring`` resolved: its scaling is not ``auto``): the
    kNN score, the same without same-author neighbours, the predictions and the clustering scores."""
    labels = [list(d) for d in meta["datasets"]]
    metric, pool, scaling = scoring.metric, scoring.pool, scoring.scaling
    knn = knn_dataset_score(geo, labels, metric=metric, pool=pool, scaling=scaling)
    authors = [a if isinstance(a, str) and a else None for a in meta["author"]]
    by_author = knn_dataset_score(geo, labels, metric=metric, pool=pool, exclude_same=authors, scaling=scaling)
    pred = predict_datasets(geo, labels, k=scoring.k, metric=metric, scaling=scaling)
    return knn, by_author, pred, clustering_scores(geo, labels, metric=metric, seed=seed)


def _runner(execution: Execution) -> TaskRunner | None:
    """Where the nearest lists' pass runs: here (None), or as tasks on the Ray cluster ``execution`` names."""
    if execution.engine == "local":
        return None
    if execution.engine != "ray":
        raise ValueError(f"cluster runs its pass here (local) or on a Ray cluster (ray), not on {execution.engine!r}")
    from ..run.ray_blocks import ray_runner

    return ray_runner(execution.address, execution.workers)


def _scored_on_lists(
    pop: Population,
    meta: pd.DataFrame,
    scoring: Scoring,
    drawn: tuple[str, int],
    label_sources: Sequence[str] | None,
    stack: ExitStack,
    where: tuple[TaskRunner | None, str],
    progress: Callable[[int, int], None] | None,
) -> tuple[ClusterReport, np.ndarray | None, pd.DataFrame, np.ndarray]:
    """The report's scores and map (``drawn``: its reducer and seed) from each model's nearest lists
    (:mod:`~modelvec.report.lists`), and the models they cover (the population's sound vectors: their rows of
    ``meta``, their positions). ``where``: the pass's runner (a Ray cluster's) and device here."""
    from ..store.views.listed import lists_of
    from . import lists

    reduce, seed = drawn
    runner, device = where
    g = lists_of(pop, meta, scoring, runner, progress, device)
    stack.enter_context(one_blas_thread())
    meta = meta.iloc[g.positions].reset_index(drop=True)
    knn, by_author = lists.knn_scores(g, meta, scoring)
    pred = lists.predictions(g, meta, scoring)
    clustering = lists.clusterers(pop, meta, g.positions, scoring.metric, seed)
    report = _report(pop, meta, scoring, label_sources, knn, by_author, pred, clustering)

    def laid_out() -> dict[str, np.ndarray]:
        coordinates = lists.coordinates(g, scoring.metric)
        known = lists.map_neighbours(g, UMAP_NEIGHBOURS + 1) if reduce == "umap" else None
        return {"xy": reduce_to_2d(coordinates, reduce, seed=seed, metric=scoring.metric, neighbours=known)}

    name = f"map-{reduce}-{scoring.metric}-{seed}-lists-{parts.layout_version()}"
    xy = pop.derived(g.positions, name, laid_out)["xy"] if len(meta) >= 3 else None
    return report, xy, meta, g.positions


def _report(
    pop: Population,
    meta: pd.DataFrame,
    scoring: Scoring,
    label_sources: Sequence[str] | None,
    knn: KnnScore,
    by_author: KnnScore,
    pred: Predictions,
    clustering: dict[str, float],
) -> ClusterReport:
    """The report of these scores (``scoring`` resolved)."""
    authors = [a if isinstance(a, str) and a else None for a in meta["author"]]
    counts = pd.Series([a for a in authors if a]).value_counts()
    predictions = [
        {"model": m, "predicted": p, "confidence": float(c), "vote_share": float(v), "closeness": float(n)}
        for m, p, c, v, n in zip(meta["model"], pred.predicted, pred.confidence, pred.vote_share, pred.closeness)
        if p is not None
    ]
    return ClusterReport(
        base=pop.name,
        params=pop.representation.key(),
        n_models=len(meta),
        metric=scoring.metric,
        pool=scoring.pool,
        knn_score=knn.score,
        n_scored=knn.n_scored,
        per_dataset={d: {"score": s, "count": n} for d, (s, n) in knn.per_dataset.items()},
        loo_accuracy=pred.loo_accuracy,
        clustering=clustering,
        predictions=predictions,
        knn_score_other_authors=by_author.score,
        n_scored_other_authors=by_author.n_scored,
        n_authors=len(counts),
        largest_author_share=float(counts.iloc[0] / len(meta)) if len(counts) else float("nan"),
        label_sources=list(label_sources) if label_sources is not None else None,
        scaling=scoring.scaling,
        k=scoring.k,
    )


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
    return pop.derived(products, f"map-{reduce}-{geo.metric}-{seed}{kind}-{parts.layout_version()}", laid_out)["xy"]
