"""Do the vectors cluster by the dataset each model was fine-tuned on?

Inputs everywhere: ``X`` (n_models, dim), float32 or float64, and ``labels``: one sequence of
dataset names per model (empty = unlabelled; usually one name; several allowed). The headline
number is :func:`knn_dataset_score` (the project description's k-NN measure); the rest answer the
follow-up questions: what would the unlabelled models be (:func:`predict_datasets`), do generic
clusterers recover the datasets (:func:`clustering_scores`), which models look alike
(:func:`nearest`).

Rules shared by every function, so that two functions never disagree about a neighbour:

- Distances come from one place, ``_distances``, computed in float64. ``"cosine"`` is
  1 - cos on L2-normalised rows; a zero vector has cosine 0 with everything (itself and other
  zero vectors included), i.e. distance 1, rather than NaN. ``"euclidean"`` is
  sqrt(|a|^2 + |b|^2 - 2 a.b) with negatives from rounding clipped to 0.
- A model is never its own neighbour: its own distance is set to +inf explicitly, since with a
  duplicate vector elsewhere (distance 0) it need not be the first one in sorted order.
- Ties in distance (equal computed values) are broken by model index, lower first: every ranking
  is a full stable argsort, so results are deterministic.
- Work is done in row blocks, so memory stays O(block x n_models) beyond the float64 copy of X.
- ``scaling="mutual-proximity"`` (Schnitzer et al., JMLR 2012, the Gaussian, independent form)
  re-ranks neighbours by how unusually close two models are *for each of them*: with mu_x,
  sigma_x the mean and spread of x's distances to every other model of X,
  MP(x, y) = P(X > d) P(Y > d) for X ~ N(mu_x, sigma_x), Y ~ N(mu_y, sigma_y), and the distance
  used is -log MP (the same order as Schnitzer's 1 - MP, without rounding near 0). A model whose
  distances are all alike, such as a LoRA adapter among full fine-tunes, then still finds its own
  dataset's models, and a model close to everything (a hub) stops being everyone's neighbour. It
  depends on the whole collection, as centring does; a zero vector, or a model with no spread,
  gets MP 1/2 from its own side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..core.settings import check_field, setting, validate

METRICS = ("cosine", "euclidean")
SCALINGS = ("none", "mutual-proximity")
#: ``auto``: mutual proximity where the models mix LoRA adapters and full fine-tunes, their distances as they are
#: otherwise (:meth:`Scoring.scaling_for`). On the evidence zoo mutual proximity added 0.04-0.06 to the kNN score
#: of every representation over the mixed collection and nothing among full fine-tunes (docs/evidence.md).
AUTO = "auto"
POOLS = ("labelled", "all")


@dataclass(frozen=True)
class Scoring:
    """How neighbours are found and counted, each setting declared once (the CLI's options are made from them):
    validated once, passed whole to ``cluster``, ``neighbors`` and ``evaluate``."""

    metric: str = setting("cosine", "Distance between vectors.", choices=METRICS)
    scaling: str = setting(
        AUTO,
        "Rank neighbours by the distance as it is (none), by mutual proximity (mutual-proximity: puts adapters and "
        "full fine-tunes on one scale), or by mutual proximity where the models mix both kinds (auto).",
        choices=(AUTO, *SCALINGS),
    )
    pool: str = setting(
        "labelled",
        "The kNN score's neighbours: labelled models only, or all (unlabelled ones count as misses).",
        choices=POOLS,
    )
    k: int = setting(5, "Nearest labelled models that vote for a model's predicted dataset.", minimum=1)

    def __post_init__(self) -> None:
        validate(self)

    def scaling_for(self, adapter: Sequence[object]) -> tuple[str, str | None]:
        """The scaling to rank these models by, and why when ``auto`` chose it. ``adapter``: per model, True for a
        LoRA adapter, False for a full fine-tune, None (or NaN) where the store does not know (kept since
        2026-11-25)."""
        if self.scaling != AUTO:
            return self.scaling, None
        kinds = [bool(a) if isinstance(a, (bool, np.bool_)) else None for a in adapter]
        adapters, full, unknown = kinds.count(True), kinds.count(False), kinds.count(None)
        if adapters and full:
            return "mutual-proximity", (
                f"neighbours by mutual proximity: {adapters} LoRA adapters and {full} full fine-tunes "
                "(--scaling none: by distance alone)"
            )
        if unknown:
            return "none", (
                f"neighbours by distance: {unknown} models were stored before modelvec kept whether a model is an "
                "adapter (embed --force records it; --scaling mutual-proximity where adapters and full fine-tunes mix)"
            )
        return "none", None


#: How ``neighbors`` finds them unless told: 10 listed (and voting), by cosine distance.
NEIGHBORS_SCORING = Scoring(k=10)

_BLOCK_ELEMENTS = 1 << 22  # distances held at once (32 MiB of float64), whatever n_models is
_SCALED_MAX_N = 16384  # up to here mutual-proximity distances are computed once for all pairs (2 GiB at most) and kept


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


# --- validation ---------------------------------------------------------------------------------


def _check_scaling(scaling: object) -> str:
    """One of :data:`SCALINGS` (``auto`` is resolved first, from the models' kinds: :meth:`Scoring.scaling_for`)."""
    if scaling not in SCALINGS:
        hint = ": resolve it from the models' kinds first (Scoring.scaling_for)" if scaling == AUTO else ""
        raise ValueError(f"scaling must be one of {', '.join(SCALINGS)}, not {scaling!r}{hint}")
    return str(scaling)


def _check_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return int(value)


def _as_matrix(X: np.ndarray, name: str = "X") -> np.ndarray:
    """``X`` as a finite float64 (n_models, dim) array; a copy, so callers may modify it."""
    M = np.asarray(X)
    if M.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_models, dim), not shape {M.shape}")
    if not (np.issubdtype(M.dtype, np.floating) or np.issubdtype(M.dtype, np.integer)):
        raise ValueError(f"{name} must be numeric, not {M.dtype}")
    M = np.array(M, dtype=np.float64)
    if not np.isfinite(M).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return M


def _label_sets(labels: Sequence[Sequence[str]], n: int) -> list[frozenset[str]]:
    """One frozenset per model; a bare string per model is refused (it would be split into letters)."""
    if isinstance(labels, str) or len(labels) != n:
        raise ValueError(
            f"labels must hold one sequence of dataset names per model ({n}), "
            f"not {len(labels) if not isinstance(labels, str) else 'a string'}"
        )
    sets = []
    for i, entry in enumerate(labels):
        if isinstance(entry, str) or not all(isinstance(x, str) and x for x in entry):
            raise ValueError(
                f"labels[{i}] must be a sequence of non-empty dataset names "
                f"(e.g. ['imdb'], or [] when unlabelled), not {entry!r}"
            )
        sets.append(frozenset(entry))
    return sets


def _membership(sets: list[frozenset[str]]) -> tuple[list[str], np.ndarray]:
    """Sorted dataset names and the (n_models, n_datasets) membership matrix."""
    names = sorted(set().union(*sets)) if sets else []
    column = {name: j for j, name in enumerate(names)}
    member = np.zeros((len(sets), len(names)), dtype=bool)
    for i, s in enumerate(sets):
        member[i, [column[x] for x in s]] = True
    return names, member


# --- the one distance function ------------------------------------------------------------------


def _prepare(M: np.ndarray, metric: str) -> np.ndarray:
    """Rows ready for ``_distances``: unit rows for cosine (zero rows stay zero), as they are otherwise.

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


def _distances(A: np.ndarray, B: np.ndarray, metric: str) -> np.ndarray:
    """(len(A), len(B)) distances between rows returned by ``_prepare``; never negative."""
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
    D += sq_a[:, None]
    D += sq_b[None, :]
    np.maximum(D, 0.0, out=D)
    return np.sqrt(D, out=D)


_Stats = tuple[np.ndarray, np.ndarray]  # per row of X: mean and spread of its distances to the others
_GRAM_MAX_N = 4096  # up to here a Geometry keeps every inner product (128 MiB); above, blocks are computed on demand
EXACT_COORDINATES = 1024  # exact coordinates from a Gram matrix up to this many rows (an n x n eigendecomposition)
TOP_COORDINATES = 64  # above: this many principal coordinates (k-means and the maps need no more)


def coordinates_of(gram: np.ndarray) -> np.ndarray:
    """Coordinates Z with Z Z^T = ``gram`` (positive semi-definite, n x n), largest direction first: exact (n
    columns, every eigenvector) up to :data:`EXACT_COORDINATES` rows; above, the top :data:`TOP_COORDINATES` by a
    seeded randomized eigendecomposition (deterministic; the rest of the spectrum left out)."""
    n = len(gram)
    if n <= EXACT_COORDINATES:
        w, V = np.linalg.eigh(gram)
        order = np.argsort(w)[::-1]
        return np.ascontiguousarray(V[:, order] * np.sqrt(np.clip(w[order], 0.0, None)))
    from sklearn.utils.extmath import randomized_svd

    U, S, _ = randomized_svd(gram, n_components=TOP_COORDINATES, n_oversamples=16, n_iter=3, random_state=0)
    return np.ascontiguousarray(U * np.sqrt(S))


class Geometry:
    """The rows of X as every function here compares them, prepared once for one metric.

    Pass it instead of ``X`` to run several scores over the same vectors (as ``cluster`` does): the rows are
    validated and normalised once, and for up to 4,096 rows their inner products are computed once, in one
    product, when first needed, instead of once per score; the mutual-proximity spreads too. Distances are
    those of :func:`distance_matrix`. :meth:`from_products` makes one from the vectors' inner products alone
    (what the store accumulates block by block: no analysis needs the vectors themselves).
    """

    def __init__(self, X: np.ndarray, metric: str = "cosine") -> None:
        self.metric = check_field(Scoring, "metric", metric)
        self.vectors: np.ndarray | None = _prepare(_as_matrix(X), metric)
        self._n = len(self.vectors)
        self._gram: np.ndarray | None = None
        self._scale: np.ndarray | None = None  # per row, what its products are multiplied by (None: 1)
        self._spreads: dict[str, _Stats | None] = {}
        self._scaled: dict[str, np.ndarray] = {}
        self._coordinates: np.ndarray | None = None

    @classmethod
    def from_products(cls, G: np.ndarray, metric: str = "cosine") -> Geometry:
        """The geometry of vectors known by their inner products ``G`` (n x n, symmetric; a memory map will do:
        it is read, never written or copied whole). For cosine each product is divided by the two norms as it is
        read: a zero or non-finite vector is a zero row, as :func:`_prepare` has it."""
        geo = cls.__new__(cls)
        geo.metric = check_field(Scoring, "metric", metric)
        if G.ndim != 2 or G.shape[0] != G.shape[1]:
            raise ValueError(f"products must be a square matrix, not shape {G.shape}")
        geo._scale = None
        if metric == "cosine":
            norm = np.sqrt(np.clip(np.diagonal(G).astype(np.float64), 0.0, None))
            zero = ~(norm > 0) | ~np.isfinite(norm)
            geo._scale = np.divide(1.0, norm, out=np.zeros_like(norm), where=~zero)
        geo.vectors, geo._n, geo._gram, geo._spreads, geo._scaled = None, len(G), G, {}, {}
        geo._coordinates = None
        return geo

    def __len__(self) -> int:
        return self._n

    def _all_products(self) -> np.ndarray | None:
        if self._gram is None and self.vectors is not None and len(self) <= _GRAM_MAX_N:
            self._gram = self.vectors @ self.vectors.T
        return self._gram

    def _products(self, rows: np.ndarray, columns: np.ndarray, G: np.ndarray) -> np.ndarray:
        """The prepared rows' inner products at (rows, columns): a new float64 array."""
        block = np.asarray(G[np.ix_(rows, columns)], dtype=np.float64)
        if self._scale is not None:
            block *= self._scale[rows][:, None]
            block *= self._scale[columns][None, :]
        return block

    def _squares(self, at: np.ndarray, G: np.ndarray) -> np.ndarray:
        sq = np.asarray(G[at, at], dtype=np.float64)
        return sq * self._scale[at] ** 2 if self._scale is not None else sq

    def distances(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """(len(rows), len(columns)) distances between the rows at those indices; a new array."""
        G = self._all_products()
        if G is None:
            assert self.vectors is not None
            return _distances(self.vectors[rows], self.vectors[columns], self.metric)
        return _from_gram(
            self._products(rows, columns, G), self.metric, self._squares(rows, G), self._squares(columns, G)
        )

    def gram(self, rows: np.ndarray) -> np.ndarray:
        """The inner products of the prepared rows at ``rows`` (unit rows for cosine)."""
        G = self._all_products()
        if G is None:
            assert self.vectors is not None
            return self.vectors[rows] @ self.vectors[rows].T
        return self._products(rows, rows, G)

    def use_spread(self, scaling: str, stats: _Stats) -> None:
        """Take each row's spread for ``scaling`` as computed before (kept by the caller for these very rows)."""
        if len(stats[0]) != self._n or len(stats[1]) != self._n:
            raise ValueError(f"a spread of {len(stats[0])} rows for a geometry of {self._n}")
        self._spreads[scaling] = (np.asarray(stats[0], dtype=np.float64), np.asarray(stats[1], dtype=np.float64))

    def ranked_distances(self, rows: np.ndarray, columns: np.ndarray, stats: _Stats | None) -> np.ndarray:
        """The distances neighbours are ranked by (a new array): plain, or -log mutual proximity where ``stats``
        are given (from the ones :meth:`rank_all` computed and kept, when it was called for them)."""
        if stats is None:
            return self.distances(rows, columns)
        full = next((kept for name, kept in self._scaled.items() if self._spreads.get(name) is stats), None)
        if full is None:
            return _scaled(self.distances(rows, columns), _sub(stats, rows), _sub(stats, columns))
        return full[np.ix_(rows, columns)]

    def rank_all(self, stats: _Stats | None) -> None:
        """Compute the mutual-proximity distances of every pair once and keep them (up to :data:`_SCALED_MAX_N`
        rows: n^2 floats), for scores that rank every model's neighbours; nothing for plain distances."""
        scaling = next((name for name, kept in self._spreads.items() if kept is stats), None)
        if stats is None or scaling is None or scaling in self._scaled or self._n > _SCALED_MAX_N:
            return
        everyone = np.arange(self._n)
        full = np.empty((self._n, self._n))
        for block in _blocks(everyone, self._n):
            full[block] = _scaled(self.distances(block, everyone), _sub(stats, block), stats)
        self._scaled[scaling] = full

    def neighbours(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` nearest rows (itself first, at 0) and their distances: what a map's UMAP would search."""
        everyone = np.arange(self._n)
        k = min(k, self._n)
        index, dist = np.empty((self._n, k), np.int64), np.empty((self._n, k))
        for block, order in _ranked(self, everyone, everyone, depth=k - 1):
            D = self.distances(block, everyone)
            index[block, 0], dist[block, 0] = block, 0.0
            index[block, 1:], dist[block, 1:] = order, np.take_along_axis(D, order, axis=1)
        return index, dist

    def products_of(self, row: int) -> np.ndarray:
        """The inner products of the prepared row ``row`` with every row (unit rows for cosine)."""
        G = self._all_products()
        if G is None:
            assert self.vectors is not None
            return self.vectors @ self.vectors[row]
        return self._products(np.array([row]), np.arange(self._n), G)[0]

    def coordinates(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The prepared rows at ``rows`` (None: all) in coordinates with the same inner products (k-means' and a
        map's input): the rows themselves where they are short, else those of every row, from the Gram matrix once
        (:func:`coordinates_of`) and kept: a subset's are the same rows of them."""
        every = np.arange(self._n)
        rows = every if rows is None else rows
        if self.vectors is not None and self.vectors.shape[1] <= self._n:
            return self.vectors[rows]
        if self._coordinates is None:
            self._coordinates = coordinates_of(self.gram(every))
        return self._coordinates[rows]

    def spread(self, scaling: str) -> _Stats | None:
        """Each row's mean and standard deviation of distance to every other row (None: no scaling); kept."""
        if scaling not in self._spreads:
            self._spreads[scaling] = _spread(self, scaling)
        return self._spreads[scaling]


def _geometry(X: np.ndarray | Geometry, metric: str) -> Geometry:
    """``X`` prepared for ``metric``, or the Geometry given (whose metric must be ``metric``)."""
    if isinstance(X, Geometry):
        if X.metric != metric:
            raise ValueError(f"this Geometry was prepared for metric {X.metric!r}, not {metric!r}")
        return X
    return Geometry(X, metric)


def _spread(geo: Geometry, scaling: str) -> _Stats | None:
    """Each row's mean and standard deviation of distance to every other row (None: no scaling)."""
    if scaling == "none":
        return None
    n = len(geo)
    mu, sd = np.zeros(n), np.zeros(n)
    for block in _blocks(np.arange(n), n):
        D = geo.distances(block, np.arange(n))
        D[np.arange(len(block)), block] = np.nan
        if n > 1:
            mu[block], sd[block] = np.nanmean(D, axis=1), np.nanstd(D, axis=1)
    return mu, sd


def _scaled(D: np.ndarray, rows: _Stats, columns: _Stats) -> np.ndarray:
    """-log MP of the distances D (rows x columns), given each side's mean and spread."""
    from scipy.special import log_ndtr

    def side(mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
        z = np.divide(mu - D, sd, out=np.zeros_like(D), where=sd > 0)
        return log_ndtr(z)

    out = side(rows[0][:, None], rows[1][:, None]) + side(columns[0][None, :], columns[1][None, :])
    return np.negative(out, out=out)


def _sub(stats: _Stats, idx: np.ndarray) -> _Stats:
    return stats[0][idx], stats[1][idx]


def distance_matrix(X: np.ndarray | Geometry, *, metric: str = "cosine", scaling: str = "none") -> np.ndarray:
    """(n, n) distances between the rows of X, as every function here ranks them (diagonal 0)."""
    _check_scaling(scaling)
    geo = _geometry(X, metric)
    everyone = np.arange(len(geo))
    D = geo.distances(everyone, everyone)
    stats = geo.spread(scaling)
    if stats is not None:
        D = _scaled(D, stats, stats)
    np.fill_diagonal(D, 0.0)
    return D


def _blocks(rows: np.ndarray, n_columns: int) -> Iterator[np.ndarray]:
    step = max(1, _BLOCK_ELEMENTS // max(1, n_columns))
    for start in range(0, len(rows), step):
        yield rows[start : start + step]


def _ranked(
    geo: Geometry,
    rows: np.ndarray,
    columns: np.ndarray,
    groups: np.ndarray | None = None,
    stats: _Stats | None = None,
    depth: int | Callable[[np.ndarray], int] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per block of ``rows``: (block, order) where ``order`` ranks ``columns`` by (distance, index).

    ``stats`` (from :func:`_spread` over all rows): rank by mutual proximity instead. ``depth`` (a number, or
    one for each block): only that many nearest are ranked (the same as the first ``depth`` of a full ranking;
    n log n becomes n per row where few are needed).

    A row that is also a column gets distance +inf to itself, so it ranks last; so does a column
    in the row's group (``groups``: int codes, -1 = no group). ``columns`` is sorted (always built
    with ``flatnonzero``/``arange``), so ranking by position in ``columns`` is ranking by index.
    """
    for block in _blocks(rows, len(columns)):
        D = geo.ranked_distances(block, columns, stats)
        D[columns[None, :] == block[:, None]] = np.inf
        if groups is not None:
            D[_same_group(groups, block, columns)] = np.inf
        yield block, _first(D, depth(block) if callable(depth) else depth)


def _first(D: np.ndarray, depth: int | None) -> np.ndarray:
    """Each row's ``depth`` smallest columns by (value, index): a stable argsort, partitioned first where that
    is cheaper; a row with ties across the cut is sorted whole, so the order is exactly the full sort's."""
    n = D.shape[1]
    if depth is None or depth >= n // 2:
        return np.argsort(D, axis=1, kind="stable")[:, : n if depth is None else depth]
    depth = max(depth, 1)
    part = np.sort(np.argpartition(D, depth - 1, axis=1)[:, :depth], axis=1)  # by index: the stable sort breaks ties
    values = np.take_along_axis(D, part, axis=1)
    order = np.take_along_axis(part, np.argsort(values, axis=1, kind="stable"), axis=1)
    cut = values.max(axis=1)
    tied = np.flatnonzero((cut[:, None] >= D).sum(axis=1) > depth)  # more columns at the cut than the partition took
    for i in tied:
        order[i] = np.argsort(D[i], kind="stable")[:depth]
    return order


def _same_group(groups: np.ndarray, block: np.ndarray, columns: np.ndarray) -> np.ndarray:
    g = groups[block][:, None]
    return (g == groups[columns][None, :]) & (g >= 0)


def _group_codes(values: Sequence[object] | None, n: int) -> np.ndarray | None:
    """Int codes of a per-model grouping (e.g. author); None, "" and NaN are -1 (no group)."""
    if values is None:
        return None
    if len(values) != n:
        raise ValueError(f"exclude_same has {len(values)} entries for {n} models")
    codes: dict[object, int] = {}
    out = np.full(n, -1, np.int64)
    for i, v in enumerate(values):
        if v is None or v == "" or (isinstance(v, float) and v != v):
            continue
        out[i] = codes.setdefault(v, len(codes))
    return out


# --- public API ---------------------------------------------------------------------------------


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
      (module docstring): for collections that mix kinds of models, such as adapters and full
      fine-tunes, whose distances differ in scale.
    - Distances, zero vectors and ties: see the module docstring (ties go to the lower index).
    """
    check_field(Scoring, "pool", pool)
    _check_scaling(scaling)
    geo = _geometry(X, metric)
    n = len(geo)
    sets = _label_sets(labels, n)
    names, member = _membership(sets)
    labelled = member.any(axis=1)
    columns = np.flatnonzero(labelled) if pool == "labelled" else np.arange(n)
    member_f = member.astype(np.float64)
    per_model = np.full(n, np.nan)
    groups = _group_codes(exclude_same, n)
    stats = geo.spread(scaling)
    geo.rank_all(stats)

    def same_of(block: np.ndarray) -> np.ndarray:
        same = (member_f[block] @ member_f[columns].T) > 0  # shares a label; unlabelled never do
        same[columns[None, :] == block[:, None]] = False  # f itself is not one of "the other" k-1
        if groups is not None:
            same[_same_group(groups, block, columns)] = False
        return same

    deepest = lambda block: max(1, int(same_of(block).sum(axis=1).max(initial=0)))
    for block, order in _ranked(geo, np.flatnonzero(labelled), columns, groups, stats, depth=deepest):
        same = same_of(block)
        k_minus_1 = same.sum(axis=1)
        hits = np.cumsum(np.take_along_axis(same, order, axis=1), axis=1)
        scored = k_minus_1 > 0
        rows = np.flatnonzero(scored)
        per_model[block[scored]] = hits[rows, k_minus_1[scored] - 1] / k_minus_1[scored]
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
    k = check_field(Scoring, "k", k)
    _check_scaling(scaling)
    geo = _geometry(X, metric)
    n = len(geo)
    names, member = _membership(_label_sets(labels, n))
    labelled = np.flatnonzero(member.any(axis=1))
    stats = geo.spread(scaling)
    geo.rank_all(stats)
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
        for block, order in _ranked(geo, unlabelled, labelled, stats=stats, depth=top):
            for i, ranks in zip(block, order):
                winner, share[i] = vote(labelled[ranks[:top]])
                predicted[i] = names[winner]
        ruler = _yardstick(geo, labelled, stats)
        mine = _nearest_distances(geo, unlabelled, labelled, stats)
        apart = _nearest_distances(geo, unlabelled, labelled, None) >= 1.0 if metric == "cosine" else None
        for j, i in enumerate(unlabelled):
            near[i] = ruler.closeness(float(mine[j]), shares_direction=apart is None or not apart[j])

    correct, n_loo = 0, len(labelled) if len(labelled) >= 2 else 0
    if n_loo:
        top = min(k, len(labelled) - 1)
        for block, order in _ranked(geo, labelled, labelled, stats=stats, depth=top):
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


def _nearest_distances(geo: Geometry, rows: np.ndarray, columns: np.ndarray, stats: _Stats | None) -> np.ndarray:
    """Each row's distance to its nearest column other than itself (inf when there is none)."""
    out, done = np.full(len(rows), np.inf), 0
    for block in _blocks(rows, len(columns)):
        D = geo.ranked_distances(block, columns, stats)
        D[columns[None, :] == block[:, None]] = np.inf
        if D.shape[1]:
            out[done : done + len(block)] = D.min(axis=1)
        done += len(block)
    return out


@dataclass(frozen=True)
class Yardstick:
    """What near and far mean among the stored labelled models, to judge a query's neighbours by.

    ``near``: the median distance of a labelled model to its nearest labelled neighbour; ``far``: the median
    distance between two labelled models (mostly unrelated ones). Both over every labelled model up to 256 of
    them; above, over 256 spread evenly (each against all): a query of 10,000 stored models reads 256 rows of their
    distances, not all of them. nan when fewer than two are labelled.
    """

    near: float
    far: float

    def closeness(self, distance: float, *, shares_direction: bool = True) -> float:
        """1 when ``distance`` (a query's to its nearest labelled model) is no more than ``near``; 0 from ``far``
        on, where a neighbour is no nearer than an unrelated model; linear between. 0 too when
        ``shares_direction`` is False (cosine: the neighbour's change points no way along the query's). A query
        unlike anything stored gets no confidence, however unanimous its neighbours' votes; nan: no yardstick."""
        if self.near != self.near or distance != distance:
            return float("nan")
        if not shares_direction or distance >= self.far:
            return 0.0
        if distance <= self.near:
            return 1.0
        return float((self.far - distance) / (self.far - self.near))


_FAR_SAMPLE = 256  # rows whose distances to every labelled model give ``Yardstick`` (all of them up to this many)


def _yardstick(geo: Geometry, labelled: np.ndarray, stats: _Stats | None) -> Yardstick:
    if len(labelled) < 2:
        return Yardstick(float("nan"), float("nan"))
    rows = labelled[np.linspace(0, len(labelled) - 1, min(len(labelled), _FAR_SAMPLE)).round().astype(int)]
    near = float(np.median(_nearest_distances(geo, rows, labelled, stats)))
    D = geo.ranked_distances(rows, labelled, stats)
    far = float(np.median(D[labelled[None, :] != rows[:, None]]))
    return Yardstick(near, max(far, near))


def yardstick(
    X: np.ndarray | Geometry,
    labels: Sequence[Sequence[str]],
    *,
    metric: str = "cosine",
    scaling: str = "none",
    exclude: int | None = None,
) -> Yardstick:
    """The :class:`Yardstick` of the labelled rows of X (``exclude``: a row left out, e.g. the query itself),
    distances as :func:`nearest` gives them."""
    _check_scaling(scaling)
    geo = _geometry(X, metric)
    _, member = _membership(_label_sets(labels, len(geo)))
    labelled = np.flatnonzero(member.any(axis=1))
    stats = geo.spread(scaling)
    return _yardstick(geo, labelled[labelled != exclude] if exclude is not None else labelled, stats)


def majority_dataset(neighbour_labels: Sequence[Sequence[str]]) -> tuple[str | None, float, dict[str, int]]:
    """The dataset most of these neighbours were tuned on: (winner, its vote share, votes per dataset).

    The rule of :func:`predict_datasets`: each neighbour (nearest first) votes once for each of its labels, ties go
    to the dataset of the nearest neighbour among them. (None, nan, {}) when no neighbour has a label.
    """
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, labels in enumerate(neighbour_labels):
        for name in sorted(set(labels)):
            votes[name] = votes.get(name, 0) + 1
            first.setdefault(name, i)
    if not votes:
        return None, float("nan"), {}
    winner = min(votes, key=lambda name: (-votes[name], first[name], name))
    order = sorted(votes, key=lambda name: (-votes[name], first[name], name))  # the winner first
    return winner, votes[winner] / sum(votes.values()), {name: votes[name] for name in order}


def clustering_scores(
    X: np.ndarray | Geometry, labels: Sequence[Sequence[str]], *, metric: str = "cosine", seed: int = 0
) -> dict[str, float]:
    """Do generic clusterers, blind to the labels, recover the datasets? (1 = perfectly.)

    Computed on the models with exactly one label whose dataset has at least two such models
    (a cluster of one says nothing); needs at least two such datasets, otherwise every score is
    nan and ``n_clustered`` is 0. ``n_clustered`` is the number of models used.

    - ``silhouette``: sklearn's silhouette_score of the dataset labels, on ``_distances``.
    - ``kmeans_nmi`` / ``kmeans_ari``: KMeans with k = number of datasets (n_init=10,
      random_state=seed), on L2-normalised rows for cosine (where squared euclidean distance is
      2 x cosine distance), on the rows as they are for euclidean.
    - ``hdbscan_nmi`` / ``hdbscan_ari``: HDBSCAN(min_cluster_size=2) on precomputed distances:
      for cosine the chord distance sqrt(2 x cosine distance), i.e. euclidean between the unit
      rows KMeans sees (zero rows aside): a true metric, as HDBSCAN assumes, with the same
      neighbour order; on raw cosine distances it over-splits clusters. Noise (-1) is scored as
      one more cluster label, as returned.

    Above :data:`EXACT_COORDINATES` models (thousands, where n x n copies would not fit): k-means and HDBSCAN
    run on the top principal coordinates (:func:`coordinates_of`), and the silhouette is that of a seeded sample
    of :data:`SILHOUETTE_SAMPLE` models on their exact distances.
    """
    from sklearn.cluster import HDBSCAN, KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

    seed = _check_int("seed", seed, 0)
    geo = _geometry(X, metric)
    sets = _label_sets(labels, len(geo))
    single = Counter(next(iter(s)) for s in sets if len(s) == 1)
    kept = sorted(name for name, count in single.items() if count >= 2)
    keys = ("silhouette", "kmeans_nmi", "kmeans_ari", "hdbscan_nmi", "hdbscan_ari")
    if len(kept) < 2:
        return {**{key: float("nan") for key in keys}, "n_clustered": 0.0}
    code = {name: c for c, name in enumerate(kept)}
    rows = np.array([i for i, s in enumerate(sets) if len(s) == 1 and next(iter(s)) in code])
    truth = np.array([code[next(iter(sets[i]))] for i in rows])
    # n points span at most n dimensions: their coordinates in that span (U·Σ) keep every euclidean distance, so
    # k-means runs on n columns instead of the vector's hundreds of thousands (0.6 s -> ms for 20 models)
    Z = geo.coordinates(rows)
    kmeans = KMeans(n_clusters=len(kept), n_init=10, random_state=seed).fit_predict(Z)
    if len(rows) <= EXACT_COORDINATES:
        D = geo.distances(rows, rows)
        D += D.T  # each pair's two roundings (its products scaled in two orders) made one: precomputed metrics
        D /= 2.0  # check symmetry, which a near copy's sqrt(2 D) near 0 would fail by 1e-8 (a symmetric D: unchanged)
        np.fill_diagonal(D, 0.0)  # precomputed metrics require it; 1 for a zero vector under cosine
        chord = np.sqrt(2.0 * D) if metric == "cosine" else D  # = euclidean distance between rows of Z
        hdbscan = HDBSCAN(min_cluster_size=2, metric="precomputed", copy=True).fit_predict(chord)
        silhouette = float(silhouette_score(D, truth, metric="precomputed"))
    else:  # thousands: n^2 copies would not fit; HDBSCAN on the principal coordinates, the silhouette on a sample
        hdbscan = HDBSCAN(min_cluster_size=2).fit_predict(Z)
        silhouette = _sampled_silhouette(geo, rows, truth, seed)
    return {
        "silhouette": silhouette,
        "kmeans_nmi": float(normalized_mutual_info_score(truth, kmeans)),
        "kmeans_ari": float(adjusted_rand_score(truth, kmeans)),
        "hdbscan_nmi": float(normalized_mutual_info_score(truth, hdbscan)),
        "hdbscan_ari": float(adjusted_rand_score(truth, hdbscan)),
        "n_clustered": float(len(rows)),
    }


SILHOUETTE_SAMPLE = 2000


def _sampled_silhouette(geo: Geometry, rows: np.ndarray, truth: np.ndarray, seed: int) -> float:
    """The silhouette of ``truth`` on the exact distances of a seeded sample of :data:`SILHOUETTE_SAMPLE` rows
    (scikit-learn's own ``sample_size`` draws the same way, from the full matrix this avoids)."""
    from sklearn.metrics import silhouette_score

    pick = np.sort(np.random.default_rng(seed).choice(len(rows), min(len(rows), SILHOUETTE_SAMPLE), replace=False))
    if len(np.unique(truth[pick])) < 2:
        return float("nan")
    D = geo.distances(rows[pick], rows[pick])
    np.fill_diagonal(D, 0.0)
    return float(silhouette_score(D, truth[pick], metric="precomputed"))


def query_distances(dots: np.ndarray, squares: np.ndarray, square: float, metric: str = "cosine") -> np.ndarray:
    """A query's distances to the rows from its inner products with them (``dots``, raw vectors), their squared
    norms and its own: the distances :func:`nearest` ranks, for a query compared in one pass over stored vectors."""
    dots = np.asarray(dots, dtype=np.float64)
    squares = np.asarray(squares, dtype=np.float64)
    if check_field(Scoring, "metric", metric) == "cosine":
        norms = np.sqrt(np.clip(squares, 0.0, None) * max(float(square), 0.0))
        cos = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
        return np.clip(1.0 - cos, 0.0, 2.0)
    return np.sqrt(np.maximum(float(square) + squares - 2.0 * dots, 0.0))


def nearest(
    X: np.ndarray | Geometry,
    query: np.ndarray,
    *,
    k: int = 10,
    metric: str = "cosine",
    exclude: int | None = None,
    scaling: str = "none",
) -> tuple[np.ndarray, np.ndarray]:
    """Indices and distances of the k rows of X nearest to ``query``, by (distance, index).

    ``exclude`` drops one row, typically the query model itself (by index, not by distance, so
    a duplicate of the query is still returned at distance 0). Fewer than k rows: all of them.
    ``scaling="mutual-proximity"``: distances are -log MP, the spreads taken over the rows of X,
    and the query's over the rows other than ``exclude``.
    """
    geo = _geometry(X, metric)
    if geo.vectors is None:
        raise ValueError("a Geometry made from products ranks a query by its distances: use nearest_to")
    dim = geo.vectors.shape[1]
    q = _as_matrix(np.asarray(query).reshape(1, -1) if np.ndim(query) == 1 else query, "query")
    if q.shape != (1, dim):
        raise ValueError(f"query must be one vector of length {dim}, not shape {np.shape(query)}")
    return nearest_to(
        geo, _distances(_prepare(q, metric), geo.vectors, metric)[0], k=k, exclude=exclude, scaling=scaling
    )


def nearest_to(
    geo: Geometry, distances: np.ndarray, *, k: int = 10, exclude: int | None = None, scaling: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nearest` of a query given by its ``distances`` to the rows of ``geo`` (:func:`query_distances`)."""
    k = check_field(Scoring, "k", k)
    _check_scaling(scaling)
    n = len(geo)
    D = np.asarray(distances, dtype=np.float64).reshape(1, -1)
    if D.shape[1] != n:
        raise ValueError(f"distances must hold one per row ({n}), not {D.shape[1]}")
    if exclude is not None:
        exclude = _check_int("exclude", exclude, 0)
        if exclude >= n:
            raise ValueError(f"exclude must be a row index < {n}, not {exclude}")
    stats = geo.spread(scaling)
    if stats is not None:
        others = np.ones(n, dtype=bool)
        if exclude is not None:
            others[exclude] = False
        mine = D[:, others]
        own = (mine.mean(axis=1), mine.std(axis=1)) if others.any() else (np.zeros(1), np.zeros(1))
        D = _scaled(D, own, stats)
    d = D[0]
    order = np.argsort(d, kind="stable")
    if exclude is not None:
        order = order[order != exclude]
    order = order[:k]
    return order, d[order]


def cosine_contributions(query: np.ndarray, others: np.ndarray, bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """(n_others, n_blocks): block b's share of each cosine, q_b·x_b / (|q| |x|); the row sums are the cosines.

    Which layers and families carry the similarity between two models: a block's share is positive
    where the two fine-tunes moved that block alike, negative where they moved it in opposite ways.
    """
    q = np.asarray(query, dtype=np.float64)
    x = np.atleast_2d(np.asarray(others, dtype=np.float64))
    norms = np.linalg.norm(q) * np.linalg.norm(x, axis=1)
    out = np.zeros((len(x), len(bounds)))
    for j, (start, stop) in enumerate(bounds):
        out[:, j] = x[:, start:stop] @ q[start:stop]
    return np.divide(out, norms[:, None], out=np.zeros_like(out), where=norms[:, None] > 0)


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
    return np.array([knn_dataset_score(X[:, a:b], labels, metric=metric, scaling=scaling).score for a, b in bounds])
