"""How neighbours are ranked, in row blocks: by (distance, index), a model never its own neighbour, ties to the lower
index, and only as deep as asked. Memory: one block of distances at a time (:data:`BLOCK_ELEMENTS`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

BLOCK_ELEMENTS = 1 << 22  # distances held at once (32 MiB of float64), whatever n_models is


class Ranks(Protocol):
    """What ranking needs of a geometry (:class:`~modelvec.analyse.geometry.Geometry`)."""

    def ranked_distances(self, rows: np.ndarray, columns: np.ndarray, scaling: str) -> np.ndarray: ...


def blocks(rows: np.ndarray, n_columns: int) -> Iterator[np.ndarray]:
    """``rows`` in blocks of at most :data:`BLOCK_ELEMENTS` distances to ``n_columns`` columns."""
    step = max(1, BLOCK_ELEMENTS // max(1, n_columns))
    for start in range(0, len(rows), step):
        yield rows[start : start + step]


def ranked(
    geo: Ranks,
    rows: np.ndarray,
    columns: np.ndarray,
    groups: np.ndarray | None = None,
    scaling: str = "none",
    depth: int | Callable[[np.ndarray], int] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per block of ``rows``: (block, order) where ``order`` ranks ``columns`` by (distance, index).

    ``scaling``: ``"mutual-proximity"`` ranks by mutual proximity over all rows instead. ``depth`` (a number, or
    one for each block): only that many nearest are ranked (the same as the first ``depth`` of a full ranking;
    n log n becomes n per row where few are needed).

    A row that is also a column gets distance +inf to itself, so it ranks last; so does a column
    in the row's group (``groups``: int codes, -1 = no group). ``columns`` is sorted (always built
    with ``flatnonzero``/``arange``), so ranking by position in ``columns`` is ranking by index.
    """
    for block in blocks(rows, len(columns)):
        D = geo.ranked_distances(block, columns, scaling)
        D[columns[None, :] == block[:, None]] = np.inf
        if groups is not None:
            D[same_group(groups, block, columns)] = np.inf
        yield block, first(D, depth(block) if callable(depth) else depth)


def first(D: np.ndarray, depth: int | None) -> np.ndarray:
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


def same_group(groups: np.ndarray, block: np.ndarray, columns: np.ndarray) -> np.ndarray:
    g = groups[block][:, None]
    return (g == groups[columns][None, :]) & (g >= 0)


def nearest_distances(geo: Ranks, rows: np.ndarray, columns: np.ndarray, scaling: str) -> np.ndarray:
    """Each row's distance to its nearest column other than itself (inf when there is none)."""
    out, done = np.full(len(rows), np.inf), 0
    for block in blocks(rows, len(columns)):
        D = geo.ranked_distances(block, columns, scaling)
        D[columns[None, :] == block[:, None]] = np.inf
        if D.shape[1]:
            out[done : done + len(block)] = D.min(axis=1)
        done += len(block)
    return out
