"""Do generic clusterers, blind to the labels, recover the datasets? The clustering scores of the vectors (the
inputs as :mod:`modelvec.analyse.scores` takes them), and, above :data:`EXACT_COORDINATES` models, the seeded sample
the clusterers run on and each score's bootstrap interval over it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.settings import validate_params
from .geometry import EXACT_COORDINATES, Geometry, geometry_of
from .inputs import integer, label_sets


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
    geo = geometry_of(X, metric)
    picked = clustered(labels, len(geo), seed)
    if picked is None:
        return {**{key: float("nan") for key in CLUSTERING_KEYS}, "n_clustered": 0.0}
    return scores_of(geo, picked, metric=metric, seed=seed)


@dataclass(frozen=True)
class Clustered:
    """The models the clusterers run on: ``rows`` (sorted), each one's dataset as a code (``truth``), how many datasets
    (``n_clusters``), and how many models could have been (``everyone``: more than ``rows`` where they are a
    sample)."""

    rows: np.ndarray
    truth: np.ndarray
    n_clusters: int
    everyone: int


def clustered(labels: Sequence[Sequence[str]], n: int, seed: int = 0) -> Clustered | None:
    """The models :func:`clustering_scores` runs on (None: fewer than two datasets with two single-label models):
    those with one label whose dataset has two such, a stratified seeded sample of :data:`CLUSTER_SAMPLE` above
    :data:`EXACT_COORDINATES`."""
    sets = label_sets(labels, n)
    single = Counter(next(iter(s)) for s in sets if len(s) == 1)
    kept = sorted(name for name, count in single.items() if count >= 2)
    if len(kept) < 2:
        return None
    code = {name: c for c, name in enumerate(kept)}
    rows = np.array([i for i, s in enumerate(sets) if len(s) == 1 and next(iter(s)) in code])
    truth = np.array([code[next(iter(sets[i]))] for i in rows])
    everyone = len(rows)
    if everyone > EXACT_COORDINATES:
        pick = stratified(truth, CLUSTER_SAMPLE, seed)
        rows, truth = rows[pick], truth[pick]
    return Clustered(rows, truth, len(kept), everyone)


def scores_of(geo: Geometry, picked: Clustered, *, metric: str = "cosine", seed: int = 0) -> dict[str, float]:
    """The clustering scores of the models ``picked`` (their rows of ``geo``; a geometry of those models alone will
    do, their rows renumbered), with intervals where they are a sample."""
    from sklearn.cluster import HDBSCAN, KMeans
    from sklearn.metrics import silhouette_samples

    rows, truth, everyone = picked.rows, picked.truth, picked.everyone
    # n points span at most n dimensions: their coordinates in that span (U·Σ) keep every euclidean distance, so
    # k-means runs on n columns instead of the vector's hundreds of thousands (0.6 s -> ms for 20 models)
    Z = geo.coordinates(rows)
    kmeans = KMeans(n_clusters=picked.n_clusters, n_init=10, random_state=seed).fit_predict(Z)
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


def stratified(truth: np.ndarray, size: int, seed: int) -> np.ndarray:
    """A seeded sample of ``size`` positions (sorted), each class in proportion to its count (largest remainders
    rounded up; at least 2 of each class that has them, so that every dataset can still form a cluster). Where the
    classes are too many for two of each (thousands of small datasets), each position is drawn with the same chance
    and a class drawn once gets a second: each dataset drawn in its share, able to form a cluster."""
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
    if take.min() < np.minimum(counts, 2).min() or take.max() < 2:
        return _drawn(truth, size, rng)
    picked = [rng.choice(np.flatnonzero(truth == c), t, replace=False) for c, t in zip(classes, take)]
    return np.sort(np.concatenate(picked))


def _drawn(truth: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` positions drawn alike, then a second of each class drawn once (where it has one)."""
    picked = rng.choice(len(truth), size, replace=False)
    classes, counts = np.unique(truth[picked], return_counts=True)
    chosen = set(picked.tolist())
    more = []
    for c in classes[counts == 1]:
        others = [int(i) for i in np.flatnonzero(truth == c) if int(i) not in chosen]
        if others:
            more.append(int(rng.choice(others)))
    return np.sort(np.concatenate([picked, np.array(more, dtype=np.int64)]))


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
