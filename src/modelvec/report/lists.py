"""The cluster report from each model's nearest lists, where every pair's products would not fit in memory
(above :data:`~modelvec.store.derived.neighbours.PAIRS_UP_TO` models, or ``--neighbours lists``).

Every score is the one the pairwise products give, from lists kept beside the store: the kNN dataset score and the one
without same-author neighbours (each model's k - 1 nearest, k its dataset's size: the lists are that deep), the
predictions and their leave-one-out accuracy. Each model's spread for mutual proximity, what "far" means for a
prediction's closeness and the map's starting coordinates come from every model's distances to the landmarks
(:func:`~modelvec.store.derived.landmarks.landmarks`); the clusterers run on their seeded sample of models, read from
the vector file; the map is laid out from each model's 15 nearest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..analyse.clustering import CLUSTERING_KEYS, Clustered, clustered, scores_of
from ..analyse.geometry import Geometry, principal_coordinates
from ..analyse.graph import Lists
from ..analyse.graph_scores import knn_from_lists, predictions_from_lists
from ..analyse.neighbours import Yardstick
from ..analyse.proximity import Stats, scaled
from ..analyse.scores import KnnScore, Predictions, Scoring
from ..store import Population
from ..store.derived.landmarks import Landmarks
from ..store.derived.products import EXACT_UP_TO
from ..store.views.listed import OnLists


def knn_scores(g: OnLists, meta: pd.DataFrame, scoring: Scoring) -> tuple[KnnScore, KnnScore]:
    """The kNN dataset score, and the same with same-author neighbours left out."""
    labels = [list(d) for d in meta["datasets"]]
    metric, pool, scaling = scoring.metric, scoring.pool, scoring.scaling
    return (
        knn_from_lists(g.scored, labels, g.eligible, metric=metric, pool=pool, scaling=scaling),
        knn_from_lists(g.scored, labels, g.eligible, metric=metric, pool=pool, scaling=scaling, exclude_same=g.groups),
    )


#: Labelled models whose distances to the landmarks say what "far" means (a seeded sample of them above).
FAR_ROWS = 4096


def stick_of(
    lm: Landmarks, labelled: np.ndarray, stats: Stats | None, metric: str, voters: Lists | None = None
) -> Yardstick:
    """What near and far mean among the labelled models (:class:`~modelvec.analyse.neighbours.Yardstick`), from the
    labelled landmarks: near, the median of their distances to their nearest labelled model (from ``voters``, the
    lists of nearest labelled models; without them, to their nearest labelled landmark); far, the median of their
    distances to the other labelled models (up to :data:`FAR_ROWS` of them, a seeded sample beyond), ranked as
    ``stats`` say (mutual proximity; None: plain distance)."""
    at = lm.positions[labelled[lm.positions]]
    if len(at) < 1 or labelled.sum() < 2:
        return Yardstick(float("nan"), float("nan"))
    rows = np.flatnonzero(labelled)
    if len(rows) > FAR_ROWS:
        rows = np.sort(np.random.default_rng(0).choice(rows, FAR_ROWS, replace=False))
    mine = labelled[lm.positions]

    def ranked(rows: np.ndarray) -> np.ndarray:
        D = lm.distances(metric, rows)[:, mine]
        if stats is not None:
            D = scaled(D, (stats[0][rows], stats[1][rows]), (stats[0][at], stats[1][at]))
        D[rows[:, None] == at[None, :]] = np.inf
        return D

    D = ranked(rows)
    far = float(np.median(D[np.isfinite(D)]))
    if voters is not None:
        firsts = [voters.row(int(i))[1][:1] for i in at]
        near = float(np.median([v[0] for v in firsts if len(v)])) if any(len(v) for v in firsts) else far
    else:
        near = float(np.median(ranked(at).min(axis=1))) if len(at) > 1 else far
    return Yardstick(near, max(far, near))


def predictions(g: OnLists, meta: pd.DataFrame, scoring: Scoring) -> Predictions:
    labels = [list(d) for d in meta["datasets"]]
    return predictions_from_lists(
        g.voters,
        labels,
        stick_of(g.landmarks, g.labelled, g.stats, scoring.metric, g.voters),
        g.nearest_plain,
        k=scoring.k,
        metric=scoring.metric,
        scaling=scoring.scaling,
    )


#: The clustering scores' code: kept scores are read only where they were computed by the same.
CLUSTERERS_VERSION = 1


def clusterers(pop: Population, meta: pd.DataFrame, positions: np.ndarray, metric: str, seed: int) -> dict[str, float]:
    """The clustering scores on their seeded sample of models (:func:`~modelvec.analyse.clustering.clustered`), its
    vectors read from the vector file and compared exactly; kept beside the store for exactly these vectors and
    labels (:meth:`~modelvec.store.Population.derived`)."""
    labels = [list(d) for d in meta["datasets"]]
    picked = clustered(labels, len(meta), seed)
    if picked is None:
        return {**{key: float("nan") for key in CLUSTERING_KEYS}, "n_clustered": 0.0}

    def computed() -> dict[str, np.ndarray]:
        X = pop.rows(positions[picked.rows])
        exact = len(X) ** 2 * X.shape[1] <= EXACT_UP_TO  # as the pairwise products are taken: float64 while quick
        G = X.astype(np.float64) @ X.astype(np.float64).T if exact else np.asarray(X @ X.T, dtype=np.float64)
        geo = Geometry.from_products(G, metric)
        own = Clustered(np.arange(len(picked.rows)), picked.truth, picked.n_clusters, picked.everyone)
        found = scores_of(geo, own, metric=metric, seed=seed)
        names = np.frombuffer(json.dumps(sorted(found)).encode(), np.uint8)
        return {"names": names, "values": np.array([found[k] for k in sorted(found)], dtype=np.float64)}

    inputs = label_digest([[str(CLUSTERERS_VERSION), str(seed)], *labels])
    kept = pop.derived(positions, f"clusterers-{metric}-{seed}", computed, inputs=inputs)
    names = json.loads(bytes(np.asarray(kept["names"], np.uint8)).decode())
    return {str(k): float(v) for k, v in zip(names, kept["values"])}


def coordinates(g: OnLists, metric: str) -> np.ndarray:
    """Every model's top principal coordinates from its products with the landmarks (the Nystrom extension), as the
    geometry's coordinates are from its sample: the map's start, a PCA or t-SNE map's input."""
    lm = g.landmarks
    dots = lm.dots
    if metric == "cosine":
        scale = np.sqrt(np.clip(lm.squares, 0.0, None))
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        dots = dots * np.multiply.outer(inv, inv[lm.positions])
    column = {int(p): j for j, p in enumerate(lm.positions)}

    def products(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:  # rows: the landmarks
        return np.array(dots[np.asarray(cols)][:, [column[int(r)] for r in rows]].T, dtype=np.float64)

    return principal_coordinates(len(dots), products, sample=lm.positions)


def map_neighbours(g: OnLists, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each model's ``k`` nearest by plain distance, itself first at 0 (what UMAP lays a map out from)."""
    index, distance = g.map.first(k - 1)
    n = len(index)
    index = np.hstack([np.arange(n)[:, None], index])
    distance = np.hstack([np.zeros((n, 1)), distance])
    missing = index < 0  # a model with fewer neighbours than k (a tiny population): itself again, as far as can be
    index[missing] = np.broadcast_to(np.arange(n)[:, None], index.shape)[missing]
    distance[missing] = np.inf
    return index, distance


def label_digest(labels: Sequence[Sequence[str]]) -> str:
    return hashlib.sha256(json.dumps([sorted(x) for x in labels]).encode()).hexdigest()
