"""Maps: model vectors (n, d) reduced to a few coordinates (n, 2) to look at.

One function, :func:`reduce`, in the scikit-learn spirit: a numpy array in, a numpy array out, the parameters
validated once before any work. Three methods:

- ``"pca"``: :class:`sklearn.decomposition.PCA` (linear, Euclidean; PC 1 carries the most variance).
- ``"tsne"``: :class:`sklearn.manifold.TSNE` with ``init="pca"`` (so its result does not depend on ``seed``) and
  perplexity ``min(30, (n - 1) / 3)``; the exact gradient up to ``TSNE_EXACT_MAX_N`` = 200 models (Barnes-Hut can
  take ~40 s for 5 points whose layout flies apart), Barnes-Hut above.
- ``"umap"``: :mod:`modelvec.analyse.umap_style` (umap-learn's method and defaults, its numba kernel kept compiled, laid
  out in parallel and deterministically) of each row's ``min(15, n - 1)`` nearest rows, itself included, started
  from the top principal coordinates; 500 epochs, 200 from ``UMAP_KNOWN_FROM`` rows.

Vectors longer than there are models (d > n) are first written in a basis of their own span (:func:`row_space`,
n x n): the same inner products, so every method sees the same distances and principal components (up to sign),
at a fraction of the cost. The same input gives the same array, bit for bit, on one machine. Small n is documented
behaviour, never a crash: one model is a point at the origin; PCA's coordinates beyond min(n, d) are zeros; below
``MIN_NEIGHBOUR_N`` = 4 models (or n < n_components + 2) t-SNE and UMAP have no neighbourhoods, so the map is
classical multidimensional scaling of the pairwise distances in ``metric`` (2 or 3 points at exactly their
distances), and a :class:`UserWarning` says so.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..core.settings import setting, validate

REDUCERS = ("pca", "tsne", "umap")
#: From this many models ``reduce="auto"`` draws UMAP; below, t-SNE (the map of a hundred models is as readable with
#: t-SNE, in under a second, and UMAP's compiled code may not be kept yet: ~5 s the first time on a machine).
AUTO_UMAP_FROM = 101
MIN_NEIGHBOUR_N = 4  # below this t-SNE and UMAP have no neighbourhoods; see the module docstring
TSNE_EXACT_MAX_N = 200  # t-SNE's exact gradient up to here, Barnes-Hut above
UMAP_NEIGHBOURS = 15
UMAP_KNOWN_FROM = 2000  # from here UMAP takes the nearest neighbours given (they cost it most of its time)
UMAP_EPOCHS = 500  # UMAP's epochs below UMAP_KNOWN_FROM rows (umap-learn's up to 10,000)
UMAP_EPOCHS_KNOWN = 200  # and from there (umap-learn's above 10,000): a map of thousands needs fewer


@dataclass(frozen=True)
class Reduction:
    """How ``cluster`` draws its 2-D map, each setting declared once (the CLI's options are made from them)."""

    reduce: str = setting(
        "auto",
        f"The 2-D map: auto (t-SNE below {AUTO_UMAP_FROM} models, UMAP from there), umap, tsne or pca.",
        choices=("auto", *REDUCERS),
    )
    standardize: bool = setting(False, "Standardise features before the map.", negation="--no-standardize")

    def __post_init__(self) -> None:
        validate(self)

    def reducer_for(self, n_models: int) -> tuple[str, str | None]:
        """The reducer drawn for ``n_models``, and the line that says why where ``auto`` chose it."""
        if self.reduce != "auto":
            return self.reduce, None
        if n_models >= AUTO_UMAP_FROM:
            return "umap", f"umap: {n_models} models"
        return "tsne", f"t-SNE for {n_models} models (--reduce umap draws UMAP)"


def reduce(
    X: np.ndarray,
    reducer: str = "umap",
    *,
    standardize: bool = False,
    seed: int = 0,
    n_components: int = 2,
    metric: str = "cosine",
    neighbours: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Reduce ``X`` (n models x d features) to ``(n, n_components)`` float64 coordinates.

    ``standardize`` scales every feature to zero mean and unit variance first (sklearn's
    :class:`~sklearn.preprocessing.StandardScaler`; constant features stay 0), so that one
    feature with a huge scale does not decide the map on its own. ``metric`` is the distance
    t-SNE and UMAP use (any name scikit-learn's ``pairwise_distances`` knows,
    e.g. ``"cosine"``, ``"euclidean"``); PCA ignores it. ``seed`` fixes every random choice.
    ``neighbours``: each row's nearest rows and their distances in ``metric`` (indices and distances, nearest
    first, the row itself first at 0), known already (from the vectors' products): from :data:`UMAP_KNOWN_FROM`
    rows UMAP takes them instead of searching for them, and runs 200 epochs.

    Raises ValueError for an unknown reducer, bad parameters, or an ``X`` that is not a finite
    2-D array with at least one row.
    """
    if reducer not in REDUCERS:
        raise ValueError(f"unknown reducer {reducer!r}: expected one of {', '.join(REDUCERS)}")
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"metric must be a metric name, got {metric!r}")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"X must be a 2-D array (n models, d features) with n, d >= 1, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or infinite values")
    n_components, seed = int(n_components), int(seed)
    n = X.shape[0]

    if standardize:
        from sklearn.preprocessing import StandardScaler

        X = StandardScaler().fit_transform(X)
    if n == 1:
        return np.zeros((1, n_components))
    if X.shape[1] > n:
        X = row_space(X)
    if reducer == "pca":
        return _pca(X, n_components, seed)
    if n < max(MIN_NEIGHBOUR_N, n_components + 2):
        warnings.warn(
            f"{reducer}: {n} models are too few for neighbourhoods; using classical MDS of the "
            f"{metric} distances instead (exact for 2-3 points)",
            UserWarning,
            stacklevel=2,
        )
        return _classical_mds(X, n_components, metric)
    if reducer == "tsne":
        return _tsne(X, n_components, seed, metric)
    return _umap(X, n_components, seed, metric, neighbours if n >= UMAP_KNOWN_FROM else None)


def row_space(X: np.ndarray) -> np.ndarray:
    """The rows of ``X`` (n x d, d > n) as coordinates in an orthonormal basis of their span, largest direction
    first: n x n, with the same inner products, so the same norms, distances, cosines and principal components
    (up to sign). What every map sees is unchanged, for a fraction of the work on long vectors (from the Gram
    matrix: n^2 d, once)."""
    w, U = np.linalg.eigh(X @ X.T)
    order = np.argsort(w)[::-1]
    return np.ascontiguousarray(U[:, order] * np.sqrt(np.clip(w[order], 0.0, None)))


def _pad(Y: np.ndarray, n_components: int) -> np.ndarray:
    """``Y`` as C-contiguous float64 with zero columns appended up to ``n_components``."""
    out = np.zeros((Y.shape[0], n_components))
    out[:, : Y.shape[1]] = Y
    return out


def _pca(X: np.ndarray, n_components: int, seed: int) -> np.ndarray:
    from sklearn.decomposition import PCA

    k = min(n_components, *X.shape)
    return _pad(PCA(n_components=k, random_state=seed).fit_transform(X), n_components)


def _tsne(X: np.ndarray, n_components: int, seed: int, metric: str) -> np.ndarray:
    from sklearn.manifold import TSNE

    n = X.shape[0]
    tsne = TSNE(
        n_components=n_components,
        perplexity=min(30.0, (n - 1) / 3),
        init="pca",
        random_state=seed,
        metric=metric,
        method="barnes_hut" if n > TSNE_EXACT_MAX_N and n_components < 4 else "exact",
    )
    return _pad(tsne.fit_transform(X), n_components)


def _umap(
    X: np.ndarray, n_components: int, seed: int, metric: str, neighbours: tuple[np.ndarray, np.ndarray] | None
) -> np.ndarray:
    """UMAP (:func:`modelvec.analyse.umap_style.layout`) of each row's nearest rows: those given, else found exactly
    (scikit-learn, every pair's distance: a map's few thousand rows), from the rows' top principal coordinates."""
    from .umap_style import layout

    n = X.shape[0]
    k = min(UMAP_NEIGHBOURS, n - 1)  # neighbours counting the row itself, as umap-learn's n_neighbors
    if neighbours is None or neighbours[0].shape[1] < k:
        from sklearn.neighbors import NearestNeighbors

        found = NearestNeighbors(n_neighbors=k - 1, metric=metric, algorithm="brute").fit(X)
        distances, indices = found.kneighbors()  # each row's k - 1 nearest but itself; itself put first below
        indices = np.hstack([np.arange(n)[:, None], indices])
        distances = np.hstack([np.zeros((n, 1)), distances])
    else:
        indices, distances = neighbours[0][:, :k], neighbours[1][:, :k]
    epochs = UMAP_EPOCHS if n < UMAP_KNOWN_FROM else UMAP_EPOCHS_KNOWN
    flat = not np.ptp(X, axis=0).any()  # every row the same: no principal direction to start from
    start = np.zeros((n, n_components)) if flat else _pca(X, n_components, seed)
    return layout(indices, distances, start, n_epochs=epochs, seed=seed)


def _classical_mds(X: np.ndarray, n_components: int, metric: str) -> np.ndarray:
    """Classical (Torgerson) MDS of the ``metric`` distances; signs fixed so the result is deterministic."""
    from sklearn.metrics import pairwise_distances

    D = pairwise_distances(X, metric=metric)
    D = (D + D.T) / 2
    n = D.shape[0]
    J = np.eye(n) - np.full((n, n), 1.0 / n)
    B = -0.5 * J @ (D**2) @ J
    values, vectors = np.linalg.eigh((B + B.T) / 2)
    order = np.argsort(values)[::-1][:n_components]
    Y = vectors[:, order] * np.sqrt(np.clip(values[order], 0.0, None))
    Y[np.abs(Y) < 1e-12 * max(1.0, float(np.abs(Y).max(initial=0.0)))] = 0.0
    for j in range(Y.shape[1]):  # each axis: its largest-magnitude coordinate positive (first such)
        i = int(np.argmax(np.abs(Y[:, j])))
        if Y[i, j] < 0:
            Y[:, j] = -Y[:, j]
    return _pad(Y, n_components)
