"""The landmarks of a population's vectors: every vector's inner products with a seeded sample of
:data:`LANDMARKS` of them (every one where there are no more), in one pass over the vector file. From them come each
model's spread for mutual proximity (its distances to the landmarks: every other model's where the population is
that small, so the same as from every pair), what "far" means for a prediction's closeness, the map's starting
coordinates, and the exact rows against which an approximation is measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from ...analyse.geometry import distances_of
from ...analyse.proximity import Stats
from ..formats.blocks import BlockReader, Selection
from ..formats.vectorfile import VectorFile
from .products import EXACT_UP_TO

#: The landmarks: every model's products with these many stored vectors (every one where there are no more).
LANDMARKS = 256


@dataclass
class Landmarks:
    """Every vector's inner products with the landmarks: ``positions`` (in the selection, sorted), ``dots``
    (n x L, float64), each vector's squared norm ``squares`` (float64), and the vectors found damaged (model ->
    line; their rows are zeros)."""

    positions: np.ndarray
    dots: np.ndarray
    squares: np.ndarray
    damaged: dict[str, str] = field(default_factory=dict)
    #: the rows read (and checked) by the pass that made these (the others were kept)
    computed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def subset(self, rows: np.ndarray) -> Landmarks:
        """The landmarks of the vectors at ``rows`` alone (renumbered in that order; a landmark not among them
        dropped)."""
        rows = np.asarray(rows, np.int64)
        where = np.full(len(self.squares), -1, np.int64)
        where[rows] = np.arange(len(rows))
        keep = where[self.positions] >= 0
        return Landmarks(where[self.positions[keep]], self.dots[rows][:, keep], self.squares[rows])

    def distances(self, metric: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Every vector's (those at ``rows``) plain distance to each landmark, as the pairwise products' geometry
        gives it."""
        at = np.arange(len(self.squares)) if rows is None else np.asarray(rows, np.int64)
        P = self.dots[at].copy()
        sq_l = self.squares[self.positions]
        if metric == "cosine":
            scale = scale_of(self.squares)
            P *= np.multiply.outer(scale[at], scale[self.positions])
        return distances_of(P, metric, self.squares[at], sq_l)

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


def scale_of(squares: np.ndarray) -> np.ndarray:
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
    vector_file: VectorFile,
    selection: Selection,
    positions: np.ndarray,
    *,
    rows: Sequence[int] | None = None,
    block_rows: int = 512,
) -> Landmarks:
    """One pass over the selection's vectors (those at ``rows``, default all) in file order: each one's products
    with the vectors at ``positions`` and its squared norm (float64; the others' rows zeros), the products float64
    where they are few (:data:`EXACT_UP_TO` multiply-adds, as the pairwise products), else float32."""
    n = len(selection)
    todo = list(range(n)) if rows is None else [int(i) for i in rows]
    exact = len(todo) * len(positions) * selection.dim <= EXACT_UP_TO
    kind: type[np.floating] = np.float64 if exact else np.float32
    reader = BlockReader(vector_file, selection, max(len(positions), 1))
    L = np.array(reader.read([int(p) for p in positions])[0][: len(positions)], dtype=kind)
    dots, squares = np.zeros((n, len(positions))), np.zeros(n)
    rows_reader = BlockReader(vector_file, selection, block_rows)
    order = sorted(todo, key=lambda i: selection.offsets[i])
    for start in range(0, len(order), block_rows):
        mine = order[start : start + block_rows]
        X = rows_reader.read(mine)[0][: len(mine)]
        at = np.asarray(mine, np.int64)
        dots[at] = np.asarray(X, dtype=kind) @ L.T
        squares[at] = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    damaged = {**reader.damaged, **rows_reader.damaged}
    return Landmarks(np.asarray(positions, np.int64), dots, squares, damaged, computed=np.asarray(order, np.int64))


def update_landmarks(
    vector_file: VectorFile,
    selection: Selection,
    earlier: tuple[list[str], list[str], np.ndarray, np.ndarray] | None,
) -> tuple[Landmarks, int]:
    """The selection's landmarks, from those kept (``earlier``: the vectors' checksums, the landmarks', their dots
    and squares) where every landmark is still there: only new vectors' rows computed; else drawn and computed
    anew (:func:`landmark_positions`). And how many rows were computed."""
    where = {h: i for i, h in enumerate(selection.hashes)}
    if earlier is None or any(h not in where for h in earlier[1]) or len(selection) <= LANDMARKS:
        lm = landmarks(vector_file, selection, landmark_positions(selection))
        return lm, len(selection)
    hashes, marks, dots, squares = earlier
    before = {h: i for i, h in enumerate(hashes)}
    source = np.array([before.get(h, -1) for h in selection.hashes], dtype=np.int64)
    positions = np.array([where[h] for h in marks], dtype=np.int64)
    new = np.flatnonzero(source < 0)
    if len(new):
        lm = landmarks(vector_file, selection, positions, rows=new.tolist())
    else:  # nothing new: no vector read
        dim = np.asarray(dots).shape[1]
        lm = Landmarks(positions, np.zeros((len(selection), dim)), np.zeros(len(selection)))
    old = source >= 0
    lm.dots[old], lm.squares[old] = np.asarray(dots)[source[old]], np.asarray(squares)[source[old]]
    return lm, len(new)
