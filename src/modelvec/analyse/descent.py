"""The descent of :mod:`modelvec.analyse.umap_style`: one numba kernel, compiled once per machine and kept
(``cache=True``; where numba finds no folder to keep it in, compiled in each process), apart so that numba is
imported only where a map is laid out."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from numba import njit, prange

NEGATIVE_RATE = 5  # negative samples for each sample of an edge (umap-learn's negative_sample_rate)


def descend_source(
    Y: np.ndarray,
    indptr: np.ndarray,
    tails: np.ndarray,
    every: np.ndarray,
    a: float,
    b: float,
    n_epochs: int,
    states: np.ndarray,
    pull: float,
) -> None:
    """``n_epochs`` of descent on ``Y`` (n, dim), in place. Each epoch every row i (in parallel) is pulled toward
    each neighbour ``tails[indptr[i]:indptr[i + 1]]`` due a sample (edge e every ``every[e]`` epochs) and pushed
    from :data:`NEGATIVE_RATE` random rows a sample (from ``states[i]``, its own stream), against the positions at
    the epoch's start; each step clipped to 4, the pull's ``pull`` times as long, the rate falling from 1 to 0."""
    n, dim = Y.shape
    every_negative = every / NEGATIVE_RATE
    next_sample = every.copy()
    next_negative = every_negative.copy()
    before = np.empty_like(Y)
    for epoch in range(n_epochs):
        alpha = 1.0 - epoch / n_epochs
        before[:] = Y
        for i in prange(n):
            state = states[i]
            for e in range(indptr[i], indptr[i + 1]):
                if next_sample[e] > epoch:
                    continue
                j = tails[e]
                d2 = 0.0
                for c in range(dim):
                    d2 += (Y[i, c] - before[j, c]) ** 2
                attract = -2.0 * a * b * d2 ** (b - 1.0) / (a * d2**b + 1.0) if d2 > 0.0 else 0.0
                for c in range(dim):
                    Y[i, c] += pull * alpha * min(4.0, max(-4.0, attract * (Y[i, c] - before[j, c])))
                next_sample[e] += every[e]
                draws = int((epoch - next_negative[e]) / every_negative[e])
                for _ in range(draws):
                    state ^= state << 13  # xorshift64 on the row's own state
                    state ^= (state >> 7) & 0x01FFFFFFFFFFFFFF
                    state ^= state << 17
                    m = (state & 0x7FFFFFFFFFFFFFFF) % n
                    if m == i:
                        continue
                    d2 = 0.0
                    for c in range(dim):
                        d2 += (Y[i, c] - before[m, c]) ** 2
                    if d2 > 0.0:
                        push = 2.0 * b / ((0.001 + d2) * (a * d2**b + 1.0))
                        for c in range(dim):
                            Y[i, c] += alpha * min(4.0, max(-4.0, push * (Y[i, c] - before[m, c])))
                next_negative[e] += draws * every_negative[e]
            states[i] = state


@functools.cache
def compiled(*, cache: bool) -> Callable[..., None]:
    """:func:`descend_source` compiled by numba (on its first call), its code kept across runs where ``cache``; one
    of each a process (code compiled anew where the kept code fails is compiled once however often it is asked)."""
    return njit(cache=cache, parallel=True, nogil=True)(descend_source)


try:
    descend = compiled(cache=True)
except RuntimeError:  # no folder numba may keep compiled code in (it refuses at decoration): compiled each process
    descend = compiled(cache=False)
