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

from typing import Protocol

import numpy as np

from .ranking import blocks

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

    def spread(self, scaling: str) -> Stats | None:
        """Each row's mean and standard deviation of distance to every other row (None: no scaling); kept."""
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
        return kept[np.ix_(rows, columns)]

    def rank_all(self, scaling: str) -> None:
        """Compute the mutual-proximity distances of every pair once and keep them (up to :data:`SCALED_MAX_N`
        rows: n^2 floats, beyond the blocks' memory), for scores that rank every model's neighbours; nothing for
        plain distances."""
        stats, n = self.spread(scaling), len(self._geo)
        if stats is None or scaling in self._all or n > SCALED_MAX_N:
            return
        everyone = np.arange(n)
        full = np.empty((n, n))
        for block in blocks(everyone, n):
            full[block] = scaled(self._geo.distances(block, everyone), sub(stats, block), stats)
        self._all[scaling] = full


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


def scaled(D: np.ndarray, rows: Stats, columns: Stats) -> np.ndarray:
    """-log MP of the distances D (rows x columns), given each side's mean and spread."""
    from scipy.special import log_ndtr

    def side(mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
        z = np.divide(mu - D, sd, out=np.zeros_like(D), where=sd > 0)
        return log_ndtr(z)

    out = side(rows[0][:, None], rows[1][:, None]) + side(columns[0][None, :], columns[1][None, :])
    return np.negative(out, out=out)


def sub(stats: Stats, idx: np.ndarray) -> Stats:
    return stats[0][idx], stats[1][idx]
