"""Each stored model's nearest models, computed in row blocks streamed from the vector file: what the reports read
where a population's pairwise products would not fit (:data:`PAIRS_UP_TO`), O(n x k) in memory whatever n is.

Two passes over the vectors, each vector checked against its checksum as it is read:

- **landmarks** (:func:`landmarks`): every vector's inner products with a seeded sample of :data:`LANDMARKS`
  stored vectors (all of them in a smaller population). From them: each model's spread for mutual proximity (its
  distances to the landmarks: every other model's where the population is that small, so the same as from every
  pair), what "far" means for a prediction's closeness, the map's starting coordinates, and the exact rows against
  which an approximation is measured;
- **neighbours** (:func:`nearest_lists`): every pair's product once, in the blocks the pairwise products are computed
  in (:func:`~modelvec.store.products.gram` with a consumer), each block's distances offered to every model's
  lists (:class:`~modelvec.analyse.graph.Nearest`): the nearest by the ranking (plain or mutual proximity) among
  all models, among those the scores count, and the plain nearest the map is laid out from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from ..analyse.geometry import _from_gram
from ..analyse.graph import Lists, Nearest
from ..analyse.proximity import Stats, scaled
from .blocks import BlockReader, Selection
from .products import EXACT_UP_TO, PAIRS_UP_TO, gram
from .vectorfile import VectorFile

__all__ = ["LANDMARKS", "MAP_NEAR", "NEAR", "PAIRS_UP_TO", "Landmarks", "Wanted", "landmarks", "nearest_lists"]
#: The landmarks: every model's products with these many stored vectors (every one where there are no more).
LANDMARKS = 256
#: How deep every model's list of nearest models goes (``neighbors --k`` up to this, the map's 15).
NEAR = 32
#: The map's neighbours (UMAP's 15, the row itself counted).
MAP_NEAR = 16


@dataclass
class Landmarks:
    """Every vector's inner products with the landmarks: ``positions`` (in the selection, sorted), ``dots``
    (n x L, float64), each vector's squared norm ``squares`` (float64), and the vectors found damaged (model ->
    line; their rows are zeros)."""

    positions: np.ndarray
    dots: np.ndarray
    squares: np.ndarray
    damaged: dict[str, str] = field(default_factory=dict)

    def subset(self, rows: np.ndarray) -> Landmarks:
        """The landmarks of the vectors at ``rows`` alone (renumbered in that order; a landmark not among them
        dropped)."""
        rows = np.asarray(rows, np.int64)
        where = np.full(len(self.squares), -1, np.int64)
        where[rows] = np.arange(len(rows))
        keep = where[self.positions] >= 0
        return Landmarks(where[self.positions[keep]], self.dots[rows][:, keep], self.squares[rows])

    def distances(self, metric: str) -> np.ndarray:
        """Every vector's plain distance to each landmark (n x L), as the pairwise products' geometry gives it."""
        P = self.dots.copy()
        sq_l = self.squares[self.positions]
        if metric == "cosine":
            scale = _scale(self.squares)
            P *= np.multiply.outer(scale, scale[self.positions])
        return _from_gram(P, metric, self.squares, sq_l)

    def spread(self, metric: str) -> Stats:
        """Each vector's mean and standard deviation of distance to the landmarks other than itself (to every other
        vector where every vector is a landmark)."""
        D = self.distances(metric)
        own = np.full(len(D), -1, np.int64)
        own[self.positions] = np.arange(len(self.positions))
        mine = np.flatnonzero(own >= 0)
        D[mine, own[mine]] = np.nan
        if D.shape[1] - (own >= 0).any() < 1:
            return np.zeros(len(D)), np.zeros(len(D))
        return np.nanmean(D, axis=1), np.nanstd(D, axis=1)


def _scale(squares: np.ndarray) -> np.ndarray:
    """1 / norm of each vector (0 for a zero one), as the products' geometry scales a cosine."""
    norm = np.sqrt(np.clip(squares, 0.0, None))
    zero = ~(norm > 0) | ~np.isfinite(norm)
    return np.divide(1.0, norm, out=np.zeros_like(norm), where=~zero)


def landmark_positions(selection: Selection, count: int = LANDMARKS) -> np.ndarray:
    """The landmarks of a selection: every position where it holds ``count`` or fewer vectors, else the ``count``
    whose checksums hash lowest (a sample that depends on the vectors alone, not on their order or names)."""
    n = len(selection)
    if n <= count:
        return np.arange(n)
    keys = np.array([xxhash.xxh3_64_intdigest(h.encode()) for h in selection.hashes], dtype=np.uint64)
    return np.sort(np.argsort(keys, kind="stable")[:count])


def landmarks(
    vector_file: VectorFile, selection: Selection, positions: np.ndarray, *, block_rows: int = 512
) -> Landmarks:
    """One pass over the selection's vectors in file order: each one's products with the vectors at ``positions``
    and its squared norm (float64), the products float64 where they are few (:data:`EXACT_UP_TO` multiply-adds, as
    the pairwise products), else float32."""
    n = len(selection)
    exact = n * len(positions) * selection.dim <= EXACT_UP_TO
    kind: type[np.floating] = np.float64 if exact else np.float32
    reader = BlockReader(vector_file, selection, max(len(positions), 1))
    L = np.array(reader.read([int(p) for p in positions])[0][: len(positions)], dtype=kind)
    dots, squares = np.zeros((n, len(positions))), np.zeros(n)
    rows = BlockReader(vector_file, selection, block_rows)
    order = sorted(range(n), key=lambda i: selection.offsets[i])
    for start in range(0, n, block_rows):
        mine = order[start : start + block_rows]
        X = rows.read(mine)[0][: len(mine)]
        at = np.asarray(mine, np.int64)
        dots[at] = np.asarray(X, dtype=kind) @ L.T
        squares[at] = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    return Landmarks(np.asarray(positions, np.int64), dots, squares, {**reader.damaged, **rows.damaged})


@dataclass(frozen=True)
class Wanted:
    """One list every model keeps: its ``depth`` nearest (per model) among the ``eligible`` columns, ranked by
    ``ranking`` (``plain`` distance or the ``scaled`` one)."""

    name: str
    depths: np.ndarray
    eligible: np.ndarray
    ranking: str = "plain"


class _Offers:
    """The consumer of a pass of products: each block's distances offered to every wanted list, both ways."""

    def __init__(self, n: int, metric: str, wanted: Sequence[Wanted], stats: Stats | None) -> None:
        self.metric, self.wanted, self.stats = metric, list(wanted), stats
        self.nearest = {w.name: Nearest(w.depths) for w in self.wanted}

    def __call__(self, rows: np.ndarray, cols: np.ndarray, P: np.ndarray, sq_r: np.ndarray, sq_c: np.ndarray) -> None:
        block = np.array(P, dtype=np.float64)
        if self.metric == "cosine":
            block *= np.multiply.outer(_scale(sq_r), _scale(sq_c))
        D = _from_gram(block, self.metric, sq_r, sq_c)
        self._offer(rows, cols, D)
        inside = np.isin(rows, cols)
        if (~inside).any():  # the pairs' other side (a held block against itself holds both already)
            self._offer(cols, rows[~inside], D[~inside].T)

    def _offer(self, rows: np.ndarray, cols: np.ndarray, D: np.ndarray) -> None:
        ranked = None
        own = rows[:, None] == cols[None, :]
        for w in self.wanted:
            if w.ranking == "plain":
                V = D.copy()
            else:
                if ranked is None:
                    assert self.stats is not None
                    mu, sd = self.stats
                    ranked = scaled(D, (mu[rows], sd[rows]), (mu[cols], sd[cols]))
                V = ranked.copy()
            V[:, ~w.eligible[cols]] = np.inf
            V[own] = np.inf
            self.nearest[w.name].offer(rows, cols, V, D)


def nearest_lists(
    vector_file: VectorFile,
    selection: Selection,
    wanted: Sequence[Wanted],
    *,
    metric: str = "cosine",
    stats: Stats | None = None,
    progress: Callable[[int, int], None] | None = None,
    **pass_options: object,
) -> tuple[dict[str, Lists], dict[str, str]]:
    """Every model's ``wanted`` lists from one pass of products over the selection's vectors (each pair once), and
    the vectors found damaged (model -> line: left out of every list). ``stats``: each model's spread, for lists
    ranked by mutual proximity."""
    offers = _Offers(len(selection), metric, wanted, stats)
    products = gram(vector_file, selection, consumer=offers, progress=progress, **pass_options)  # type: ignore[arg-type]
    found = {name: nb.lists() for name, nb in offers.nearest.items()}
    if products.damaged:  # a damaged vector was read as zeros: out of every list
        keep = np.full(len(selection), -1, np.int64)
        keep[products.positions] = products.positions
        found = {name: lists.remapped(keep) for name, lists in found.items()}
    return found, dict(products.damaged)
