"""The rows of X as every score compares them: distances, inner products and coordinates, from the vectors or from
their inner products alone.

Every distance is computed in this module, in float64, by one of three paths that agree: between prepared rows
(:func:`row_distances`), from the prepared rows' inner products (:func:`_from_gram`, which the first also uses), and a
query's to the rows from its raw inner products with them (:func:`query_distances`). ``"cosine"`` is 1 - cos on
L2-normalised rows; a zero vector has cosine 0 with everything (itself and other zero vectors included), i.e.
distance 1, rather than NaN. ``"euclidean"`` is sqrt(|a|^2 + |b|^2 - 2 a.b) with negatives from rounding clipped
to 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..core.settings import check_field
from .inputs import Scoring, as_matrix
from .proximity import Proximity, Stats
from .ranking import ranked, take

_GRAM_MAX_N = 4096  # up to here a Geometry of vectors keeps every inner product (128 MiB); above, blocks on demand
EXACT_COORDINATES = 1024  # exact coordinates from a Gram matrix up to this many rows (an n x n eigendecomposition)
TOP_COORDINATES = 64  # above: this many principal coordinates (k-means and the maps need no more)
COORDINATE_SAMPLE = 2048  # ... of the principal directions of this many rows (a seeded sample), every row projected


def prepare_rows(M: np.ndarray, metric: str) -> np.ndarray:
    """Rows ready for ``row_distances``: unit rows for cosine (zero rows stay zero), as they are otherwise.

    Rows are divided by their largest entry before the norm is taken, so huge or tiny vectors
    neither overflow nor underflow.
    """
    if metric == "euclidean":
        return M
    if M.shape[1] == 0:
        return np.zeros_like(M)
    scale = np.maximum(M.max(axis=1), -M.min(axis=1))  # the largest |entry|, without an |M| copy
    zero = ~(scale > 0)  # a zero row (or one that is not a number) is zeros
    scale[zero] = 1.0
    Z = M / scale[:, None]
    Z[zero] = 0.0
    norm = np.sqrt(np.einsum("ij,ij->i", Z, Z))
    norm[zero] = 1.0
    Z /= norm[:, None]
    return Z


def row_distances(A: np.ndarray, B: np.ndarray, metric: str) -> np.ndarray:
    """(len(A), len(B)) distances between rows returned by ``prepare_rows``; never negative."""
    if metric == "cosine":
        return _from_gram(A @ B.T, metric)
    return _from_gram(A @ B.T, metric, np.einsum("ij,ij->i", A, A), np.einsum("ij,ij->i", B, B))


def _from_gram(
    G: np.ndarray, metric: str, sq_a: np.ndarray | None = None, sq_b: np.ndarray | None = None
) -> np.ndarray:
    """Distances from the inner products ``G`` of prepared rows (overwritten), given the rows' squared norms for
    euclidean (cosine's rows are unit or zero); never negative."""
    if metric == "cosine":
        D = np.subtract(1.0, G, out=G)
        return np.clip(D, 0.0, 2.0, out=D)
    assert sq_a is not None and sq_b is not None
    D = np.multiply(G, -2.0, out=G)
    D += np.add.outer(sq_a, sq_b)  # the two squares added first: a pair's distance the same both ways
    np.maximum(D, 0.0, out=D)
    return np.sqrt(D, out=D)


def distances_of(products: np.ndarray, metric: str, sq_a: np.ndarray, sq_b: np.ndarray) -> np.ndarray:
    """Distances from inner products (overwritten), as every geometry gives them: for cosine, of rows already scaled
    to unit norm (the products divided by the two norms; a zero row's are 0); for euclidean, of the raw rows given
    their squared norms ``sq_a`` and ``sq_b``. Never negative."""
    return _from_gram(products, metric, sq_a, sq_b)


def query_distances(dots: np.ndarray, squares: np.ndarray, square: float, metric: str = "cosine") -> np.ndarray:
    """A query's distances to the rows from its inner products with them (``dots``, raw vectors), their squared
    norms and its own: the distances :func:`~modelvec.analyse.neighbours.nearest` ranks, for a query compared in
    one pass over stored vectors."""
    dots = np.asarray(dots, dtype=np.float64)
    squares = np.asarray(squares, dtype=np.float64)
    if check_field(Scoring, "metric", metric) == "cosine":
        norms = np.sqrt(np.clip(squares, 0.0, None) * max(float(square), 0.0))
        cos = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
        return np.clip(1.0 - cos, 0.0, 2.0)
    return np.sqrt(np.maximum(float(square) + squares - 2.0 * dots, 0.0))


def coordinates_of(gram: np.ndarray) -> np.ndarray:
    """Coordinates Z with Z Z^T = ``gram`` (positive semi-definite, n x n; a memory map will do), largest direction
    first: :func:`principal_coordinates` of its entries."""
    return principal_coordinates(len(gram), lambda rows, columns: np.array(take(gram, rows, columns), np.float64))


def principal_coordinates(
    n: int, products: Callable[[np.ndarray, np.ndarray], np.ndarray], sample: np.ndarray | None = None
) -> np.ndarray:
    """Coordinates Z of n rows known by their inner products (``products(rows, columns)``, a new float64 array),
    largest direction first: exact (Z Z^T the whole Gram matrix: n columns, every eigenvector) up to
    :data:`EXACT_COORDINATES` rows. Above, the top :data:`TOP_COORDINATES` principal directions of a seeded sample
    of :data:`COORDINATE_SAMPLE` rows (their Gram matrix's randomized eigendecomposition), every row projected on
    them exactly (the Nystrom extension: the sample's products with every row, read in blocks), so the
    work grows as n, not n^2; the sample's own coordinates are what the whole matrix's would be at that size.
    ``sample``: the rows whose products with every row are known (sorted), in place of the seeded one."""
    every = np.arange(n)
    if n <= EXACT_COORDINATES and sample is None:
        w, V = np.linalg.eigh(products(every, every))
        order = np.argsort(w)[::-1]
        return np.ascontiguousarray(V[:, order] * np.sqrt(np.clip(w[order], 0.0, None)))
    from sklearn.utils.extmath import randomized_svd

    if sample is None:
        sample = np.sort(np.random.default_rng(0).choice(n, min(n, COORDINATE_SAMPLE), replace=False))
    U, S, _ = randomized_svd(
        products(sample, sample),
        n_components=min(TOP_COORDINATES, len(sample)),
        n_oversamples=16,
        n_iter=3,
        random_state=0,
    )
    live = S[0] * 1e-12 < S if len(S) and S[0] > 0 else np.zeros(len(S), dtype=bool)
    basis = np.zeros((len(sample), len(S)))
    basis[:, live] = U[:, live] / np.sqrt(S[live])  # a direction the sample does not span is zeros
    Z = np.empty((n, len(S)))
    for block in np.array_split(every, max(1, -(-n * len(sample) // (1 << 22)))):
        Z[block] = products(sample, block).T @ basis  # the sample's rows (symmetric): their pages only
    return Z


class _Rows(Protocol):
    """Where a geometry's numbers come from: the prepared vectors, or their inner products."""

    @property
    def vectors(self) -> np.ndarray | None: ...  # the prepared rows, where they are known

    def __len__(self) -> int: ...

    def distances(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray: ...

    def gram(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray: ...

    def products_of(self, row: int) -> np.ndarray: ...


class _Products:
    """Rows known by their inner products ``G`` (a memory map will do: read, never written or copied whole), each
    product multiplied by its two rows' ``scale`` as it is read (None: 1)."""

    def __init__(self, G: np.ndarray, metric: str, scale: np.ndarray | None) -> None:
        self.G, self.metric, self.scale = G, metric, scale

    @property
    def vectors(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self.G)

    def gram(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        block = np.array(take(self.G, rows, columns), dtype=np.float64)  # a new array: callers write in it
        if self.scale is not None:  # by the two scales' product: a pair's value the same both ways
            block *= np.multiply.outer(self.scale[rows], self.scale[columns])
        return block

    def _squares(self, at: np.ndarray) -> np.ndarray:
        sq = np.asarray(self.G[at, at], dtype=np.float64)
        return sq * self.scale[at] ** 2 if self.scale is not None else sq

    def distances(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        return _from_gram(self.gram(rows, columns), self.metric, self._squares(rows), self._squares(columns))

    def products_of(self, row: int) -> np.ndarray:
        return self.gram(np.array([row]), np.arange(len(self)))[0]


class _Vectors:
    """Prepared rows; up to :data:`_GRAM_MAX_N` of them, their inner products are taken once, in one product, when
    first needed, and kept (:class:`_Products`)."""

    def __init__(self, rows: np.ndarray, metric: str) -> None:
        self.rows, self.metric = rows, metric
        self._gram: _Products | None = None
        self._lock = threading.Lock()  # row blocks ask from several threads: the product is taken once

    @property
    def vectors(self) -> np.ndarray:
        return self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def _kept(self) -> _Products | None:
        if self._gram is None and len(self) <= _GRAM_MAX_N:
            with self._lock:
                if self._gram is None:
                    self._gram = _Products(self.rows @ self.rows.T, self.metric, None)
        return self._gram

    def distances(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        kept = self._kept()
        if kept is not None:
            return kept.distances(rows, columns)
        return row_distances(self.rows[rows], self.rows[columns], self.metric)

    def gram(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        kept = self._kept()
        return kept.gram(rows, columns) if kept is not None else self.rows[rows] @ self.rows[columns].T

    def products_of(self, row: int) -> np.ndarray:
        kept = self._kept()
        return kept.products_of(row) if kept is not None else self.rows @ self.rows[row]


class Geometry:
    """The rows of X as every score compares them, prepared once for one metric.

    Pass it instead of ``X`` to run several scores over the same vectors (as ``cluster`` does): the rows are
    validated and normalised once, and for up to 4,096 rows their inner products are computed once, in one
    product, when first needed, instead of once per score; the mutual-proximity spreads too. Distances are
    those of :func:`~modelvec.analyse.neighbours.distance_matrix`. :meth:`from_products` makes one from the
    vectors' inner products alone (what the store accumulates block by block: no analysis needs the vectors
    themselves); the two answer alike, only :attr:`vectors` is None for the second.
    """

    def __init__(self, X: np.ndarray, metric: str = "cosine") -> None:
        metric = check_field(Scoring, "metric", metric)
        self._made(_Vectors(prepare_rows(as_matrix(X), metric), metric), metric)

    @classmethod
    def from_products(cls, G: np.ndarray, metric: str = "cosine") -> Geometry:
        """The geometry of vectors known by their inner products ``G`` (n x n, symmetric; a memory map will do:
        it is read, never written or copied whole). For cosine each product is divided by the two norms as it is
        read: a zero or non-finite vector is a zero row, as :func:`prepare_rows` has it."""
        metric = check_field(Scoring, "metric", metric)
        if G.ndim != 2 or G.shape[0] != G.shape[1]:
            raise ValueError(f"products must be a square matrix, not shape {G.shape}")
        scale = None
        if metric == "cosine":
            norm = np.sqrt(np.clip(np.diagonal(G).astype(np.float64), 0.0, None))
            zero = ~(norm > 0) | ~np.isfinite(norm)
            scale = np.divide(1.0, norm, out=np.zeros_like(norm), where=~zero)
        geo = cls.__new__(cls)
        geo._made(_Products(G, metric, scale), metric)
        return geo

    def _made(self, rows: _Rows, metric: str) -> None:
        self.metric = metric
        self._rows = rows
        self._n = len(rows)
        self._proximity = Proximity(rows)
        self._coordinates: np.ndarray | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    @property
    def vectors(self) -> np.ndarray | None:
        """The prepared rows (unit rows for cosine), or None for a geometry made from products."""
        return self._rows.vectors

    def distances(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """(len(rows), len(columns)) distances between the rows at those indices; a new array."""
        return self._rows.distances(rows, columns)

    def gram(self, rows: np.ndarray) -> np.ndarray:
        """The inner products of the prepared rows at ``rows`` (unit rows for cosine)."""
        return self._rows.gram(rows, rows)

    def products_of(self, row: int) -> np.ndarray:
        """The inner products of the prepared row ``row`` with every row (unit rows for cosine)."""
        return self._rows.products_of(row)

    def spread(self, scaling: str) -> Stats | None:
        """Each row's mean and standard deviation of distance to every other row (None: no scaling); kept."""
        return self._proximity.spread(scaling)

    def use_spread(self, scaling: str, stats: Stats) -> None:
        """Take each row's spread for ``scaling`` as computed before (kept by the caller for these very rows)."""
        self._proximity.use(scaling, stats)

    def ranked_distances(self, rows: np.ndarray, columns: np.ndarray, scaling: str) -> np.ndarray:
        """The distances neighbours are ranked by under ``scaling`` (a new array): plain, or -log mutual proximity
        (:mod:`~modelvec.analyse.proximity`)."""
        return self._proximity.distances(rows, columns, scaling)

    def every_pair(self, scaling: str) -> np.ndarray | None:
        """Every pair's distance under ``scaling`` as :meth:`rank_all` keeps it (None: plain distances, or too many
        rows to keep), for a caller that keeps it beside the store."""
        return self._proximity.every_pair(scaling)

    def use_every_pair(self, scaling: str, full: np.ndarray) -> None:
        """Take every pair's distance under ``scaling`` as computed before, for these very rows."""
        self._proximity.use_every_pair(scaling, full)

    def rank_all(self, scaling: str) -> None:
        """Keep every pair's mutual-proximity distance, for scores that rank every model's neighbours
        (:meth:`~modelvec.analyse.proximity.Proximity.rank_all`)."""
        self._proximity.rank_all(scaling)

    def neighbours(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` nearest rows (itself first, at 0) and their distances: what a map's UMAP would search."""
        everyone = np.arange(self._n)
        k = min(k, self._n)
        index, dist = np.empty((self._n, k), np.int64), np.empty((self._n, k))
        for block, order in ranked(self, everyone, everyone, depth=k - 1):
            D = self.distances(block, everyone)
            index[block, 0], dist[block, 0] = block, 0.0
            index[block, 1:], dist[block, 1:] = order, np.take_along_axis(D, order, axis=1)
        return index, dist

    def coordinates(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The prepared rows at ``rows`` (None: all) in coordinates with the same inner products (k-means' and a
        map's input): the rows themselves where they are short, else those of every row, from the Gram matrix once
        (:func:`coordinates_of`) and kept: a subset's are the same rows of them."""
        every = np.arange(self._n)
        rows = every if rows is None else rows
        vectors = self.vectors
        if vectors is not None and vectors.shape[1] <= self._n:
            return vectors[rows]
        with self._lock:  # asked by the scores and by the map's layout beside them: made once
            if self._coordinates is None:
                self._coordinates = principal_coordinates(self._n, self._rows.gram)
        return self._coordinates[rows]


def geometry_of(X: np.ndarray | Geometry, metric: str) -> Geometry:
    """``X`` prepared for ``metric``, or the Geometry given (whose metric must be ``metric``)."""
    if isinstance(X, Geometry):
        if X.metric != metric:
            raise ValueError(f"this Geometry was prepared for metric {X.metric!r}, not {metric!r}")
        return X
    return Geometry(X, metric)
