"""Do the vectors cluster by the dataset each model was fine-tuned on?

Inputs everywhere: ``X`` (n_models, dim), float32 or float64, or a :class:`~modelvec.analyse.geometry.Geometry` of
them, and ``labels``: one sequence of dataset names per model (empty = unlabelled; usually one name; several
allowed), checked as :mod:`modelvec.analyse.inputs` says. The headline number is :func:`knn_dataset_score` (the
project description's k-NN measure); the rest answer the follow-up questions: what would the unlabelled models be
(:func:`predict_datasets`), do generic clusterers recover the datasets (:func:`clustering_scores`), which models look
alike (:func:`~modelvec.analyse.neighbours.nearest`).

Rules shared by every function, so that two functions never disagree about a neighbour:

- Distances are computed in one module, :mod:`modelvec.analyse.geometry`, in float64 (its docstring says how, and
  how a zero vector counts); ``scaling="mutual-proximity"`` re-ranks them (:mod:`modelvec.analyse.proximity`).
- A model is never its own neighbour: its own distance is set to +inf explicitly, since with a
  duplicate vector elsewhere (distance 0) it need not be the first one in sorted order.
- Ties in distance (equal computed values) are broken by model index, lower first: every ranking
  is a full stable argsort, so results are deterministic.
- Memory: neighbours are ranked in row blocks (:mod:`modelvec.analyse.ranking`), O(block x n_models) beyond the
  float64 copy of X, except what a :class:`~modelvec.analyse.geometry.Geometry` keeps: every inner product up to
  4,096 rows, and, for mutual proximity, every pair's scaled distance up to 16,384 rows (n x n float64: 2 GiB).

The names of the modules this one was split from are importable from here, as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..core.settings import validate_params
from .geometry import EXACT_COORDINATES, TOP_COORDINATES, Geometry, coordinates_of, geometry_of, query_distances
from .inputs import (
    AUTO,
    METRICS,
    NEIGHBORS_SCORING,
    POOLS,
    SCALINGS,
    Scoring,
    check_scaling,
    group_codes,
    integer,
    label_sets,
    membership,
)
from .neighbours import (
    Yardstick,
    cosine_contributions,
    distance_matrix,
    majority_dataset,
    nearest,
    nearest_to,
    ruler,
    yardstick,
)
from .parallel import in_order
from .ranking import blocks, candidates, hits_within, nearest_distances, ranked, same_group

__all__ = [
    "AUTO",
    "CLUSTERING_KEYS",
    "CLUSTER_SAMPLE",
    "EXACT_COORDINATES",
    "METRICS",
    "NEIGHBORS_SCORING",
    "POOLS",
    "SCALINGS",
    "TOP_COORDINATES",
    "Geometry",
    "KnnScore",
    "Predictions",
    "Scoring",
    "Yardstick",
    "block_knn_scores",
    "clustering_scores",
    "coordinates_of",
    "cosine_contributions",
    "distance_matrix",
    "knn_dataset_score",
    "majority_dataset",
    "nearest",
    "nearest_to",
    "predict_datasets",
    "query_distances",
    "yardstick",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class KnnScore:
    """The k-NN dataset score: ``score`` is the mean of ``per_model`` over the scored models."""

    score: float
    n_scored: int
    per_dataset: dict[str, tuple[float, int]]  # dataset -> (mean over its scored models, count)
    per_model: np.ndarray  # (n_models,), nan where a model is not scored
    metric: str
    pool: str
    scaling: str = "none"


@dataclass(frozen=True, eq=False, kw_only=True)
class Predictions:
    """Majority-vote datasets for the unlabelled models, and the same rule's leave-one-out accuracy."""

    predicted: list[str | None]  # None for labelled models (and when no labelled model exists)
    confidence: np.ndarray  # (n_models,), vote_share x closeness; nan where nothing was predicted
    vote_share: np.ndarray  # (n_models,), the winner's share of the votes
    closeness: np.ndarray  # (n_models,), see :meth:`Yardstick.closeness`
    loo_accuracy: float
    n_loo: int
    k: int
    metric: str
    scaling: str = "none"


@validate_params(pool=Scoring, scaling=check_scaling)
def knn_dataset_score(
    X: np.ndarray | Geometry,
    labels: Sequence[Sequence[str]],
    *,
    metric: str = "cosine",
    pool: str = "labelled",
    exclude_same: Sequence[object] | None = None,
    scaling: str = "none",
) -> KnnScore:
    """Share of each labelled model's k-1 nearest neighbours tuned on the same dataset, averaged.

    For a model f whose dataset has k >= 2 models, take its k-1 nearest neighbours (f excluded)
    and count the share tuned on f's dataset; ``score`` is the mean over scored models. Chance
    level for random labels is about (k-1)/(n-1) per model, so compare against that, not 0.

    - ``pool="labelled"``: neighbours are drawn from the labelled models only. ``pool="all"``:
      unlabelled models are candidates too and always count as misses (a model of unknown
      dataset sitting inside a cluster lowers that cluster's score).
    - Unlabelled models are never scored; nor is a model with no other labelled model sharing a
      label (k = 1). Both are nan in ``per_model`` and absent from the mean.
    - Multi-label rule: for f with label set L_f, k-1 is the number of other labelled models
      sharing at least one label with f, and a neighbour is a hit when it shares any label with
      f. In ``per_dataset`` a multi-label model counts under each of its labels. With one label
      per model this is exactly the definition above. Datasets with no scored model are absent.
    - ``exclude_same`` (e.g. each model's author): models sharing f's value are neither
      neighbours of f nor among its k-1, so the score measures whether f lands among *other
      uploaders'* models of its dataset — an author effect (one uploader's near-identical runs)
      cannot pass for a dataset effect. Models without a value exclude nothing.
    - ``scaling="mutual-proximity"`` ranks neighbours by mutual proximity over all rows of X
      (:mod:`~modelvec.analyse.proximity`): for collections that mix kinds of models, such as adapters and full
      fine-tunes, whose distances differ in scale.
    - Distances, zero vectors and ties: see the module docstring (ties go to the lower index).
    """
    geo = geometry_of(X, metric)
    n = len(geo)
    sets = label_sets(labels, n)
    names, member = membership(sets)
    labelled = member.any(axis=1)
    columns = np.flatnonzero(labelled) if pool == "labelled" else np.arange(n)
    per_model = np.full(n, np.nan)
    groups = group_codes(exclude_same, n)
    geo.rank_all(scaling)
    shares = sharing(member)

    def of_block(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        same = shares(block, columns)  # shares a label; unlabelled never do
        same[columns[None, :] == block[:, None]] = False  # f itself is not one of "the other" k-1
        if groups is not None:
            same[same_group(groups, block, columns)] = False
        k_minus_1 = same.sum(axis=1)
        return block, hits_within(candidates(geo, block, columns, groups, scaling), same, k_minus_1), k_minus_1

    for block, hits, k_minus_1 in in_order(of_block, blocks(np.flatnonzero(labelled), len(columns))):
        scored = k_minus_1 > 0
        per_model[block[scored]] = hits[scored] / k_minus_1[scored]
    scored = ~np.isnan(per_model)
    per_dataset = {}
    for j, name in enumerate(names):
        mask = scored & member[:, j]
        if mask.any():
            per_dataset[name] = (float(per_model[mask].mean()), int(mask.sum()))
    score = float(per_model[scored].mean()) if scored.any() else float("nan")
    return KnnScore(
        score=score,
        n_scored=int(scored.sum()),
        per_dataset=per_dataset,
        per_model=per_model,
        metric=metric,
        pool=pool,
        scaling=scaling,
    )


def sharing(member: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Which rows share a label with which columns (``member``: models x datasets, boolean): codes compared where
    every model has at most one label, a product of memberships otherwise."""
    if member.sum(axis=1).max(initial=0) <= 1:
        code = np.where(member.any(axis=1), member.argmax(axis=1), -1) if member.shape[1] else np.full(len(member), -1)
        return lambda rows, columns: (code[rows][:, None] == code[columns][None, :]) & (code[rows][:, None] >= 0)
    member_f = member.astype(np.float32)
    return lambda rows, columns: (member_f[rows] @ member_f[columns].T) > 0


@validate_params(k=Scoring, scaling=check_scaling)
def predict_datasets(
    X: np.ndarray | Geometry,
    labels: Sequence[Sequence[str]],
    *,
    k: int = 5,
    metric: str = "cosine",
    scaling: str = "none",
) -> Predictions:
    """Majority dataset among each unlabelled model's k nearest labelled models.

    Each neighbour votes once for each of its labels; the winner has the most votes, ties going
    to the dataset of the nearest neighbour among them; ``vote_share`` is the winner's share of all votes cast.
    With fewer than k labelled models, all of them vote.

    ``closeness`` says whether those neighbours are near at all (:meth:`Yardstick.closeness`), and ``confidence`` is
    vote share x closeness: a unanimous vote of models that are far away is not a confident prediction.

    ``loo_accuracy`` applies the same rule to every labelled model, voting among the *other*
    labelled models, and counts it correct when the winner is one of its labels; ``n_loo`` is
    the number of models so predicted (all labelled models, when there are at least two). A
    model whose dataset has no other model can never be right: it counts as a miss, as it would
    in deployment. nan / 0 when fewer than two models are labelled. ``scaling``: as in
    :func:`knn_dataset_score`.
    """
    geo = geometry_of(X, metric)
    n = len(geo)
    names, member = membership(label_sets(labels, n))
    labelled = np.flatnonzero(member.any(axis=1))
    geo.rank_all(scaling)
    predicted: list[str | None] = [None] * n
    share, near = np.full(n, np.nan), np.full(n, np.nan)

    def vote(neighbours: np.ndarray) -> tuple[int, float]:  # ``neighbours`` nearest first
        votes = member[neighbours]
        counts = votes.sum(axis=0)
        tied = np.flatnonzero(counts == counts.max())
        winner = int(tied[np.argmin(np.argmax(votes[:, tied], axis=0))])  # the tied dataset seen nearest first
        return winner, float(counts[winner] / counts.sum())

    if len(labelled):
        unlabelled = np.flatnonzero(~member.any(axis=1))
        top = min(k, len(labelled))
        for block, order in ranked(geo, unlabelled, labelled, scaling=scaling, depth=top):
            for i, ranks in zip(block, order):
                winner, share[i] = vote(labelled[ranks[:top]])
                predicted[i] = names[winner]
        stick = ruler(geo, labelled, scaling)
        mine = nearest_distances(geo, unlabelled, labelled, scaling)
        apart = nearest_distances(geo, unlabelled, labelled, "none") >= 1.0 if metric == "cosine" else None
        for j, i in enumerate(unlabelled):
            near[i] = stick.closeness(float(mine[j]), shares_direction=apart is None or not apart[j])

    correct, n_loo = 0, len(labelled) if len(labelled) >= 2 else 0
    if n_loo:
        top = min(k, len(labelled) - 1)
        for block, order in ranked(geo, labelled, labelled, scaling=scaling, depth=top):
            for i, ranks in zip(block, order):
                winner, _ = vote(labelled[ranks[:top]])
                correct += bool(member[i, winner])
    loo = correct / n_loo if n_loo else float("nan")
    return Predictions(
        predicted=predicted,
        confidence=share * near,
        vote_share=share,
        closeness=near,
        loo_accuracy=loo,
        n_loo=n_loo,
        k=k,
        metric=metric,
        scaling=scaling,
    )


@validate_params(seed=integer(0))
def clustering_scores(
    X: np.ndarray | Geometry, labels: Sequence[Sequence[str]], *, metric: str = "cosine", seed: int = 0
) -> dict[str, float]:
    """Do generic clusterers, blind to the labels, recover the datasets? (1 = perfectly.)

    Computed on the models with exactly one label whose dataset has at least two such models
    (a cluster of one says nothing); needs at least two such datasets, otherwise every score is
    nan and ``n_clustered`` is 0. ``n_clustered`` is the number of models used.

    - ``silhouette``: sklearn's silhouette_score of the dataset labels, on the geometry's distances.
    - ``kmeans_nmi`` / ``kmeans_ari``: KMeans with k = number of datasets (n_init=10,
      random_state=seed), on L2-normalised rows for cosine (where squared euclidean distance is
      2 x cosine distance), on the rows as they are for euclidean.
    - ``hdbscan_nmi`` / ``hdbscan_ari``: HDBSCAN(min_cluster_size=2) on precomputed distances:
      for cosine the chord distance sqrt(2 x cosine distance), i.e. euclidean between the unit
      rows KMeans sees (zero rows aside): a true metric, as HDBSCAN assumes, with the same
      neighbour order; on raw cosine distances it over-splits clusters. Noise (-1) is scored as
      one more cluster label, as returned.

    Above :data:`EXACT_COORDINATES` models (thousands, where n x n copies would not fit and the clusterers would
    take longest): they run on a seeded sample of :data:`CLUSTER_SAMPLE` of them (each dataset in its share), k-means
    and HDBSCAN on their top principal coordinates (:func:`coordinates_of`), the silhouette on their exact
    distances; ``n_clustered`` is then the sample, ``n_clusterable`` all such models, and each score has a 95 %
    bootstrap interval over the sampled models (``<score>_low``, ``<score>_high``; the clusterers run once).
    """
    from sklearn.cluster import HDBSCAN, KMeans
    from sklearn.metrics import silhouette_samples

    geo = geometry_of(X, metric)
    sets = label_sets(labels, len(geo))
    single = Counter(next(iter(s)) for s in sets if len(s) == 1)
    kept = sorted(name for name, count in single.items() if count >= 2)
    if len(kept) < 2:
        return {**{key: float("nan") for key in CLUSTERING_KEYS}, "n_clustered": 0.0}
    code = {name: c for c, name in enumerate(kept)}
    rows = np.array([i for i, s in enumerate(sets) if len(s) == 1 and next(iter(s)) in code])
    truth = np.array([code[next(iter(sets[i]))] for i in rows])
    everyone = len(rows)
    if everyone > EXACT_COORDINATES:
        pick = _stratified(truth, CLUSTER_SAMPLE, seed)
        rows, truth = rows[pick], truth[pick]
    # n points span at most n dimensions: their coordinates in that span (U·Σ) keep every euclidean distance, so
    # k-means runs on n columns instead of the vector's hundreds of thousands (0.6 s -> ms for 20 models)
    Z = geo.coordinates(rows)
    kmeans = KMeans(n_clusters=len(kept), n_init=10, random_state=seed).fit_predict(Z)
    D = geo.distances(rows, rows)
    D += D.T  # each pair's two roundings made one: precomputed metrics check symmetry, which a near copy's
    D /= 2.0  # sqrt(2 D) near 0 would fail by 1e-8 (a symmetric D: unchanged)
    np.fill_diagonal(D, 0.0)  # precomputed metrics require it; 1 for a zero vector under cosine
    if everyone <= EXACT_COORDINATES:
        chord = np.sqrt(2.0 * D) if metric == "cosine" else D  # = euclidean distance between rows of Z
        hdbscan = HDBSCAN(min_cluster_size=2, metric="precomputed", copy=True).fit_predict(chord)
    else:  # the principal coordinates: a chord distance's n x n would be the sample's, but the coordinates are kept
        hdbscan = HDBSCAN(min_cluster_size=2, copy=True).fit_predict(Z)
    each = silhouette_samples(D, truth, metric="precomputed") if len(np.unique(truth)) >= 2 else np.full(len(D), np.nan)
    out = dict(zip(CLUSTERING_KEYS, _agreement(truth, kmeans, hdbscan, each)))
    out["n_clustered"] = float(len(rows))
    if everyone > EXACT_COORDINATES:
        out["n_clusterable"] = float(everyone)
        out.update(_intervals(truth, kmeans, hdbscan, each, seed))
    return out


CLUSTERING_KEYS = ("silhouette", "kmeans_nmi", "kmeans_ari", "hdbscan_nmi", "hdbscan_ari")
CLUSTER_SAMPLE = 2000  # the clusterers' models above EXACT_COORDINATES (a seeded sample, each dataset in its share)
BOOTSTRAP = 200  # resamples of the sampled models for each clustering score's interval


def _agreement(truth: np.ndarray, kmeans: np.ndarray, hdbscan: np.ndarray, silhouettes: np.ndarray) -> list[float]:
    """The clustering scores of these models (in :data:`CLUSTERING_KEYS`' order)."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    return [
        float(silhouettes.mean()),
        float(normalized_mutual_info_score(truth, kmeans)),
        float(adjusted_rand_score(truth, kmeans)),
        float(normalized_mutual_info_score(truth, hdbscan)),
        float(adjusted_rand_score(truth, hdbscan)),
    ]


def _stratified(truth: np.ndarray, size: int, seed: int) -> np.ndarray:
    """A seeded sample of ``size`` positions (sorted), each class in proportion to its count (largest remainders
    rounded up; at least 2 of each class that has them, so that every dataset can still form a cluster)."""
    if len(truth) <= size:
        return np.arange(len(truth))
    classes, counts = np.unique(truth, return_counts=True)
    quota = size * counts / len(truth)
    take = np.floor(quota).astype(int)
    take[np.argsort(take - quota, kind="stable")[: size - take.sum()]] += 1
    short = np.minimum(counts, 2) - take
    take += np.maximum(short, 0)
    take[np.argmax(take)] -= int(np.maximum(short, 0).sum())  # what the small classes gained, from the largest
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(truth == c), t, replace=False) for c, t in zip(classes, take)]
    return np.sort(np.concatenate(picked))


def _intervals(
    truth: np.ndarray, kmeans: np.ndarray, hdbscan: np.ndarray, silhouettes: np.ndarray, seed: int
) -> dict[str, float]:
    """95 % percentile bootstrap intervals of each clustering score over the sampled models (the clusters as found):
    :data:`BOOTSTRAP` resamples, each score of each resample from its contingency table (:func:`agreement_of`)."""
    rng = np.random.default_rng(seed)
    at = rng.integers(0, len(truth), (BOOTSTRAP, len(truth)))
    columns = [silhouettes[at].mean(axis=1)]
    for found in (kmeans, hdbscan):
        _, code = np.unique(found, return_inverse=True)
        columns += list(agreement_of(_tables(truth[at], code[at], int(truth.max()) + 1, int(code.max()) + 1)))
    low, high = np.nanpercentile(np.stack(columns, axis=1), [2.5, 97.5], axis=0)
    out = {}
    for key, lo, hi in zip(CLUSTERING_KEYS, low, high):
        out[f"{key}_low"], out[f"{key}_high"] = float(lo), float(hi)
    return out


def _tables(truth: np.ndarray, found: np.ndarray, r: int, c: int) -> np.ndarray:
    """The contingency table of each row of ``truth`` against the same row of ``found`` (codes 0.. r-1, 0.. c-1):
    (rows, r, c) counts."""
    draws = len(truth)
    cells = (np.arange(draws)[:, None] * r + truth) * c + found
    return np.bincount(cells.ravel(), minlength=draws * r * c).reshape(draws, r, c).astype(np.float64)


def agreement_of(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The normalised mutual information (arithmetic mean of the entropies) and the adjusted Rand index of each
    contingency table (tables x classes x clusters), as scikit-learn's ``normalized_mutual_info_score`` and
    ``adjusted_rand_score`` give them from the labels, for many tables at once."""
    n = tables.sum(axis=(1, 2))
    a, b = tables.sum(axis=2), tables.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cell = np.where(tables > 0, tables * np.log(tables * n[:, None, None] / (a[:, :, None] * b[:, None, :])), 0.0)
        mi = cell.sum(axis=(1, 2)) / n
        entropy = lambda m: -np.where(m > 0, (m / n[:, None]) * np.log(m / n[:, None]), 0.0).sum(axis=1)
        h_a, h_b = entropy(a), entropy(b)
        nmi = np.where((h_a == 0) & (h_b == 0), 1.0, mi / np.maximum((h_a + h_b) / 2, np.finfo(float).eps))
        pairs = lambda m, axes: (m * (m - 1) / 2).sum(axis=axes)
        index, rows, cols = pairs(tables, (1, 2)), pairs(a, 1), pairs(b, 1)
        expected = rows * cols / (n * (n - 1) / 2)
        most = (rows + cols) / 2
        ari = np.where(most == expected, 1.0, (index - expected) / (most - expected))
    return nmi, ari


def block_knn_scores(
    X: np.ndarray,
    labels: Sequence[Sequence[str]],
    bounds: Sequence[tuple[int, int]],
    *,
    metric: str = "cosine",
    scaling: str = "none",
) -> np.ndarray:
    """The kNN dataset score of each block of the vectors alone (columns [start, stop)): which layers and
    families separate the datasets best."""
    score = lambda bound: knn_dataset_score(X[:, bound[0] : bound[1]], labels, metric=metric, scaling=scaling).score
    return np.array(list(in_order(score, bounds)), dtype=np.float64)  # the blocks on every core
