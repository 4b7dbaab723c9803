"""The cluster report from each model's nearest lists, where every pair's products would not fit in memory
(above :data:`~modelvec.store.neighbours.PAIRS_UP_TO` models, or ``--neighbours lists``).

Every score is the one the pairwise products give, from lists kept beside the store: the kNN dataset score and the
one without same-author neighbours (each model's k - 1 nearest, k its dataset's size: the lists are that deep),
the predictions and their leave-one-out accuracy. Each model's spread for mutual proximity, what "far" means for a
prediction's closeness and the map's starting coordinates come from every model's distances to the landmarks
(:func:`~modelvec.store.neighbours.landmarks`); the clusterers run on their seeded sample of models, read from the
vector file; the map is laid out from each model's 15 nearest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analyse.clustering import CLUSTERING_KEYS, Clustered, clustered, scores_of
from ..analyse.geometry import Geometry, principal_coordinates
from ..analyse.graph import Lists, depths_for, knn_from_lists, predictions_from_lists
from ..analyse.inputs import group_codes, label_sets
from ..analyse.neighbours import Yardstick
from ..analyse.proximity import scaled
from ..analyse.scores import KnnScore, Predictions, Scoring
from ..store import Population
from ..store.neighbours import MAP_NEAR, NEAR, Landmarks, TaskRunner, Wanted
from ..store.products import EXACT_UP_TO

#: Room in each model's list beyond what its dataset needs now (a share): a dataset that grows by as much is scored
#: from the kept lists without computing them again.
SLACK = 0.25


@dataclass
class OnLists:
    """What the scores and the map of a population read in place of its pairwise products: each model's nearest
    lists (``near``: by the ranking, among every model; ``map``: by plain distance; ``scored``: among the models the
    kNN score counts, as deep as their datasets; ``voters``: among the labelled ones), each model's distance to its
    nearest labelled model (``nearest_plain``), the landmarks and each model's spread; all of them for the models at
    ``positions`` of the population's selection (its sound vectors), renumbered in that order."""

    positions: np.ndarray
    near: Lists
    map: Lists
    scored: Lists
    voters: Lists
    nearest_plain: np.ndarray
    landmarks: Landmarks
    stats: tuple[np.ndarray, np.ndarray] | None
    eligible: np.ndarray
    labelled: np.ndarray
    groups: np.ndarray | None


def on_lists(
    pop: Population,
    meta: pd.DataFrame,
    scoring: Scoring,
    runner: TaskRunner | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> OnLists:
    """The population's nearest lists for ``scoring`` (resolved) and the labels in ``meta`` (one row a model of the
    population's selection), kept beside the store or computed in one pass of products (its held blocks run by
    ``runner``: a Ray cluster's tasks; ``progress(done, total)`` after each)."""
    lm = pop.landmarks()
    n, metric, scaling = len(meta), scoring.metric, scoring.scaling
    sound = np.ones(n, dtype=bool)
    sound[[i for i, m in enumerate(meta["model"]) if m in pop.damaged]] = False
    sets = label_sets([list(d) for d in meta["datasets"]], n)
    labelled = np.array([bool(s) for s in sets]) & sound
    eligible = labelled if scoring.pool == "labelled" else sound.copy()
    groups = group_codes([a if isinstance(a, str) and a else None for a in meta["author"]], n)
    stats = lm.spread(metric) if scaling != "none" else None
    rank = "plain" if scaling == "none" else "rank"
    votes = scoring.k if scoring.pool == "labelled" else 0
    depth = np.where(sound, depths_for(sets, eligible, groups=groups, votes=votes, slack=SLACK), 0)
    wanted = [Wanted("near", np.where(sound, NEAR, 0), sound, rank), Wanted("scored", depth, eligible, rank)]
    if scaling != "none":
        wanted.append(Wanted("map", np.where(sound, MAP_NEAR, 0), sound, "plain"))
        wanted.append(Wanted("nearest", np.where(sound, 1, 0), labelled, "plain"))
    if scoring.pool != "labelled":
        wanted.append(Wanted("voters", np.where(sound, scoring.k, 0), labelled, rank))
    marks = [pop.selection.hashes[i] for i in lm.positions] if stats is not None else []
    found = pop.nearest(
        wanted, metric=metric, stats=stats, ranking=json.dumps([scaling, marks]), runner=runner, progress=progress
    )
    at = np.flatnonzero(sound)  # the damaged left out: rows and columns renumbered among the sound
    where = np.full(n, -1, np.int64)
    where[at] = np.arange(len(at))
    lists = {name: found[name].subset(at).remapped(where) for name in found}
    scored = lists["scored"]
    nearest = lists.get("nearest", scored)
    first = [nearest.row(i)[2] for i in range(len(at))]
    return OnLists(
        positions=at,
        near=lists["near"],
        map=lists.get("map", lists["near"]),
        scored=scored,
        voters=lists.get("voters", scored),
        nearest_plain=np.array([d[0] if len(d) else np.inf for d in first]),
        landmarks=lm.subset(at),
        stats=(stats[0][at], stats[1][at]) if stats is not None else None,
        eligible=eligible[at],
        labelled=labelled[at],
        groups=groups[at] if groups is not None else None,
    )


def knn_scores(g: OnLists, meta: pd.DataFrame, scoring: Scoring) -> tuple[KnnScore, KnnScore]:
    """The kNN dataset score, and the same with same-author neighbours left out."""
    labels = [list(d) for d in meta["datasets"]]
    metric, pool, scaling = scoring.metric, scoring.pool, scoring.scaling
    return (
        knn_from_lists(g.scored, labels, g.eligible, metric=metric, pool=pool, scaling=scaling),
        knn_from_lists(g.scored, labels, g.eligible, metric=metric, pool=pool, scaling=scaling, exclude_same=g.groups),
    )


def ranked_to_landmarks(g: OnLists, metric: str) -> np.ndarray:
    """Every model's distance to each landmark as neighbours are ranked (plain, or -log mutual proximity)."""
    D = g.landmarks.distances(metric)
    if g.stats is None:
        return D
    at = g.landmarks.positions
    return scaled(D, g.stats, (g.stats[0][at], g.stats[1][at]))


def stick(g: OnLists, metric: str) -> Yardstick:
    """What near and far mean among the labelled models (:class:`~modelvec.analyse.neighbours.Yardstick`), from the
    labelled landmarks: near, the median of their distances to their nearest labelled model; far, the median of
    their distances to every other labelled model."""
    at = g.landmarks.positions
    mine = np.flatnonzero(g.labelled[at])
    if len(mine) < 1 or g.labelled.sum() < 2:
        return Yardstick(float("nan"), float("nan"))
    firsts = [g.voters.row(int(at[j]))[1] for j in mine]
    near = float(np.median([v[0] for v in firsts if len(v)]))
    D = ranked_to_landmarks(g, metric)[:, mine]
    others = g.labelled[:, None] & (np.arange(len(D))[:, None] != at[mine][None, :])
    far = float(np.median(D[others]))
    return Yardstick(near, max(far, near))


def predictions(g: OnLists, meta: pd.DataFrame, scoring: Scoring) -> Predictions:
    labels = [list(d) for d in meta["datasets"]]
    return predictions_from_lists(
        g.voters,
        labels,
        stick(g, scoring.metric),
        g.nearest_plain,
        k=scoring.k,
        metric=scoring.metric,
        scaling=scoring.scaling,
    )


def clusterers(pop: Population, meta: pd.DataFrame, positions: np.ndarray, metric: str, seed: int) -> dict[str, float]:
    """The clustering scores on their seeded sample of models (:func:`~modelvec.analyse.clustering.clustered`), its
    vectors read from the vector file and compared exactly."""
    picked = clustered([list(d) for d in meta["datasets"]], len(meta), seed)
    if picked is None:
        return {**{key: float("nan") for key in CLUSTERING_KEYS}, "n_clustered": 0.0}
    X = pop.rows(positions[picked.rows])
    exact = len(X) ** 2 * X.shape[1] <= EXACT_UP_TO  # as the pairwise products are taken: float64 while it is quick
    G = X.astype(np.float64) @ X.astype(np.float64).T if exact else np.asarray(X @ X.T, dtype=np.float64)
    geo = Geometry.from_products(G, metric)
    own = Clustered(np.arange(len(picked.rows)), picked.truth, picked.n_clusters, picked.everyone)
    return scores_of(geo, own, metric=metric, seed=seed)


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
