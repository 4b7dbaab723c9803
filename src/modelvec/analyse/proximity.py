"""Mutual proximity (Schnitzer et al., JMLR 2012, the Gaussian, independent form): neighbours re-ranked by how
unusually close two models are *for each of them*.

With mu_x, sigma_x the mean and spread of x's distances to every other model, MP(x, y) = P(X > d) P(Y > d) for
X ~ N(mu_x, sigma_x), Y ~ N(mu_y, sigma_y), and the distance ranked by is -log MP (the same order as Schnitzer's
1 - MP, without rounding near 0). A model whose distances are all alike, such as a LoRA adapter among full
fine-tunes, then still finds its own dataset's models, and a model close to everything (a hub) stops being
everyone's neighbour. It depends on the whole collection, as centring does; a zero vector, or a model with no
spread, gets MP 1/2 from its own side.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from .graph import Lists
from .parallel import each
from .ranking import blocks, take

Stats = tuple[np.ndarray, np.ndarray]  # per row: mean and spread of its distances to the others
SCALED_MAX_N = 16384  # up to here every pair's -log MP is computed once and kept (n^2 float64: 2 GiB at most)


class Distances(Protocol):
    """What mutual proximity needs of a geometry: its size and its plain distances."""

    def __len__(self) -> int: ...

    def distances(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray: ...


class Proximity:
    """Mutual proximity over one geometry's rows, by scaling's name: each row's spread (computed once, or taken as
    kept beside the store), and, once :meth:`rank_all` asks, every pair's -log MP, kept."""

    def __init__(self, geo: Distances) -> None:
        self._geo = geo
        self._spreads: dict[str, Stats | None] = {}
        self._all: dict[str, np.ndarray] = {}  # scaling -> every pair's scaled distance (up to SCALED_MAX_N rows)
        self._lock = threading.Lock()  # row blocks ask from several threads: each spread is computed once

    def spread(self, scaling: str) -> Stats | None:
        """Each row's mean and standard deviation of distance to every other row (None: no scaling); kept."""
        if scaling not in self._spreads:
            with self._lock:
                if scaling not in self._spreads:
                    self._spreads[scaling] = spread(self._geo, scaling)
        return self._spreads[scaling]

    def use(self, scaling: str, stats: Stats) -> None:
        """Take each row's spread for ``scaling`` as computed before (kept by the caller for these very rows)."""
        n = len(self._geo)
        if len(stats[0]) != n or len(stats[1]) != n:
            raise ValueError(f"a spread of {len(stats[0])} rows for a geometry of {n}")
        self._spreads[scaling] = (np.asarray(stats[0], dtype=np.float64), np.asarray(stats[1], dtype=np.float64))

    def distances(self, rows: np.ndarray, columns: np.ndarray, scaling: str) -> np.ndarray:
        """The distances neighbours are ranked by under ``scaling`` (a new array): plain for ``"none"``, else -log
        mutual proximity (read from every pair's where :meth:`rank_all` kept them)."""
        stats = self.spread(scaling)
        if stats is None:
            return self._geo.distances(rows, columns)
        kept = self._all.get(scaling)
        if kept is None:
            return scaled(self._geo.distances(rows, columns), sub(stats, rows), sub(stats, columns))
        return np.array(take(kept, rows, columns))  # a new array: callers write in it

    def rank_all(self, scaling: str) -> None:
        """Compute the mutual-proximity distances of every pair once and keep them (up to :data:`SCALED_MAX_N`
        rows: n^2 floats, beyond the blocks' memory), for scores that rank every model's neighbours; nothing for
        plain distances. Each side's -log P is computed once a pair (:func:`every_pair`)."""
        stats, n = self.spread(scaling), len(self._geo)
        if stats is None or scaling in self._all or n > SCALED_MAX_N:
            return
        self._all[scaling] = every_pair(self._geo, stats)

    def every_pair(self, scaling: str) -> np.ndarray | None:
        """Every pair's ``scaling`` distance (n x n; None for plain distances or above :data:`SCALED_MAX_N` rows),
        as :meth:`rank_all` keeps it, for a caller that keeps it elsewhere (:meth:`use_every_pair`)."""
        self.rank_all(scaling)
        return self._all.get(scaling)

    def use_every_pair(self, scaling: str, full: np.ndarray) -> None:
        """Take every pair's ``scaling`` distance as computed before (a memory map will do: read, never written)."""
        n = len(self._geo)
        if full.shape != (n, n):
            raise ValueError(f"every pair's distance of shape {full.shape} for a geometry of {n}")
        self._all[scaling] = full


def every_pair(geo: Distances, stats: Stats) -> np.ndarray:
    """Every pair's -log MP (n x n): each row's own side -log P(X_i > d_ij) first, row block by row block on every
    core, then each pair's two sides added in tiles of the upper triangle (the value :func:`scaled` gives a pair:
    its row's side plus its column's, the pair's distance being the same both ways)."""
    n = len(geo)
    everyone, full = np.arange(n), np.empty((n, n))

    def sides(block: np.ndarray) -> None:
        full[block] = side(geo.distances(block, everyone), stats[0][block, None], stats[1][block, None])

    each(sides, blocks(everyone, n))
    step = max(1, int(np.sqrt(BLOCK_TILE)))
    starts = range(0, n, step)

    def pair(tile: tuple[int, int]) -> None:
        a, b = slice(tile[0], tile[0] + step), slice(tile[1], tile[1] + step)
        both = full[a, b] + full[b, a].T
        full[a, b] = both
        full[b, a] = both.T

    each(pair, [(i, j) for i in starts for j in starts if j >= i])
    return full


BLOCK_TILE = 1 << 20  # the elements of one tile when each pair's two sides are added (8 MiB of float64)


def spread(geo: Distances, scaling: str) -> Stats | None:
    """Each row's mean and standard deviation of distance to every other row (None: no scaling)."""
    if scaling == "none":
        return None
    n = len(geo)
    mu, sd = np.zeros(n), np.zeros(n)
    for block in blocks(np.arange(n), n):
        D = geo.distances(block, np.arange(n))
        D[np.arange(len(block)), block] = np.nan
        if n > 1:
            mu[block], sd[block] = np.nanmean(D, axis=1), np.nanstd(D, axis=1)
    return mu, sd


def side(D: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """-log P(X > d) for X ~ N(mu, sd) (broadcast against D); a side with no spread gives -log 1/2."""
    from scipy.special import log_ndtr

    z = np.divide(mu - D, sd, out=np.zeros(np.broadcast_shapes(D.shape, np.shape(mu)), dtype=np.float64), where=sd > 0)
    out = log_ndtr(z, out=z)
    return np.negative(out, out=out)


def scaled(D: np.ndarray, rows: Stats, columns: Stats) -> np.ndarray:
    """-log MP of the distances D (rows x columns), given each side's mean and spread."""
    out = side(D, rows[0][:, None], rows[1][:, None])
    out += side(D, columns[0][None, :], columns[1][None, :])
    return out


def sub(stats: Stats, idx: np.ndarray) -> Stats:
    return stats[0][idx], stats[1][idx]


def spread_of(sums: np.ndarray) -> Stats:
    """Each row's mean and standard deviation of distance from its sums (of distances, of squares, their count)."""
    count = np.maximum(sums[:, 2], 1.0)
    mean = sums[:, 0] / count
    return mean, np.sqrt(np.maximum(sums[:, 1] / count - mean**2, 0.0))


def ranked_by(lists: Lists, stats: Stats) -> Lists:
    """``lists`` (their plain distances kept) with each entry's value the pair's -log mutual proximity under
    ``stats``, each row sorted by it (ties to the lower index)."""
    owner = np.repeat(np.arange(len(lists)), lists.lengths())
    mu, sd = stats
    d = lists.distance
    value = side(d, mu[owner], sd[owner]) + side(d, mu[lists.index], sd[lists.index])
    order = np.lexsort((lists.index, value, owner))
    return Lists(lists.indptr, lists.index[order], value[order], d[order])
