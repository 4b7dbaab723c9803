"""How neighbours are ranked, in row blocks: by (distance, index), a model never its own neighbour, ties to the lower
index, and only as deep as asked. Memory: one block of distances a thread at a time (:data:`BLOCK_ELEMENTS`); the
blocks run on every core (:mod:`~modelvec.analyse.parallel`).

Nothing here sorts a whole row unless asked to: a few nearest come from the columns at or below a bound found from
the row's chunk minima (:func:`first`), and how many of a row's ``depth`` nearest are wanted columns from the value
at that depth (:func:`hits_within`); both give exactly what a stable full sort would."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from .parallel import in_order

BLOCK_ELEMENTS = 1 << 22  # distances held at once by one thread (32 MiB of float64), whatever n_models is
_CHUNKS = 256  # a few nearest are bounded by the row's minima over this many chunks of columns


class Ranks(Protocol):
    """What ranking needs of a geometry (:class:`~modelvec.analyse.geometry.Geometry`)."""

    def ranked_distances(self, rows: np.ndarray, columns: np.ndarray, scaling: str) -> np.ndarray: ...


def blocks(rows: np.ndarray, n_columns: int) -> Iterator[np.ndarray]:
    """``rows`` in blocks of at most :data:`BLOCK_ELEMENTS` distances to ``n_columns`` columns."""
    step = max(1, BLOCK_ELEMENTS // max(1, n_columns))
    for start in range(0, len(rows), step):
        yield rows[start : start + step]


def candidates(
    geo: Ranks,
    block: np.ndarray,
    columns: np.ndarray,
    groups: np.ndarray | None,
    scaling: str,
    off: np.ndarray | None = None,
) -> np.ndarray:
    """The ranked distances of ``block`` to ``columns`` with the columns a row may not have as neighbours at +inf:
    itself, and those of its group (``groups``: int codes, -1 = no group); ``off``: those columns, where the
    caller has them already (:func:`off_limits`)."""
    D = geo.ranked_distances(block, columns, scaling)
    D[off_limits(block, columns, groups) if off is None else off] = np.inf
    return D


def off_limits(block: np.ndarray, columns: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """Which ``columns`` each row of ``block`` may not have as a neighbour (boolean): itself, and its group's
    (``groups``: int codes, -1 = no group). ``columns`` is sorted: a row finds itself by a binary search."""
    off = same_group(groups, block, columns) if groups is not None else np.zeros((len(block), len(columns)), bool)
    at = np.minimum(np.searchsorted(columns, block), len(columns) - 1)
    mine = np.flatnonzero(columns[at] == block) if len(columns) else at[:0]
    off[mine, at[mine]] = True
    return off


def ranked(
    geo: Ranks,
    rows: np.ndarray,
    columns: np.ndarray,
    groups: np.ndarray | None = None,
    scaling: str = "none",
    depth: int | Callable[[np.ndarray], int] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per block of ``rows``, in order: (block, order) where ``order`` ranks ``columns`` by (distance, index).

    ``scaling``: ``"mutual-proximity"`` ranks by mutual proximity over all rows instead. ``depth`` (a number, or
    one for each block): only that many nearest are ranked (the same as the first ``depth`` of a full ranking;
    n log n becomes n per row where few are needed).

    A row that is also a column gets distance +inf to itself, so it ranks last; so does a column
    in the row's group (``groups``: int codes, -1 = no group). ``columns`` is sorted (always built
    with ``flatnonzero``/``arange``), so ranking by position in ``columns`` is ranking by index.
    """

    def one(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        D = candidates(geo, block, columns, groups, scaling)
        return block, first(D, depth(block) if callable(depth) else depth)

    yield from in_order(one, blocks(rows, len(columns)))


def first(D: np.ndarray, depth: int | None) -> np.ndarray:
    """Each row's ``depth`` smallest columns by (value, index), exactly as a stable argsort orders them: a full
    sort where most are asked; else the columns at or below a bound (:func:`_few`), or a partition."""
    n = D.shape[1]
    if depth is None or depth >= n // 2:
        return np.argsort(D, axis=1, kind="stable")[:, : n if depth is None else depth]
    depth = max(depth, 1)
    if n >= 4 * _CHUNKS and 2 * depth <= _CHUNKS:
        found = _few(D, depth)
        if found is not None:
            return found
    part = np.sort(np.argpartition(D, depth - 1, axis=1)[:, :depth], axis=1)  # by index: the stable sort breaks ties
    values = np.take_along_axis(D, part, axis=1)
    order = np.take_along_axis(part, np.argsort(values, axis=1, kind="stable"), axis=1)
    cut = values.max(axis=1)
    crowded = (cut[:, None] >= D).sum(axis=1) > depth  # more columns at the cut than the partition took
    tied = np.flatnonzero(crowded | np.isnan(cut))  # or values that are not numbers, which sort last
    for i in tied:
        order[i] = np.argsort(D[i], kind="stable")[:depth]
    return order


def _few(D: np.ndarray, depth: int) -> np.ndarray | None:
    """Each row's ``depth`` smallest columns by (value, index) from the columns at or below a bound: the
    ``depth``-th smallest of the row's minima over :data:`_CHUNKS` chunks of columns (``depth`` distinct chunks
    each hold a value at or below it, so the ``depth``-th smallest of the row is too). None where a row has fewer
    than ``depth`` such columns (values that are not numbers)."""
    n = D.shape[1]
    minima = np.minimum.reduceat(D, np.arange(0, n, -(-n // _CHUNKS)), axis=1)
    bound = np.partition(minima, depth - 1, axis=1)[:, depth - 1]
    rows, cols = np.nonzero(bound[:, None] >= D)
    counts = np.bincount(rows, minlength=len(D))
    if counts.min(initial=depth) < depth:
        return None
    by = np.lexsort((cols, D[rows, cols], rows))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return cols[by][starts[:, None] + np.arange(depth)]


def hits_within(D: np.ndarray, wanted: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For each row, how many of its ``depth[r]`` nearest columns by (value, index) are ``wanted`` (boolean, as D):
    the count a stable argsort's first ``depth[r]`` would give, from the value at that depth (a partition of the rows
    of each depth), ties at it taken by index. Rows of depth 0 count 0; ``depth[r]`` must not pass the row's finite
    values."""
    out = np.zeros(len(D), dtype=np.int64)
    live = np.flatnonzero(depth > 0)
    if not len(live):
        return out
    D, wanted, depth = D[live], wanted[live], depth[live]
    cut = np.empty(len(live))
    for d in np.unique(depth):  # one depth a partition: several at once take up to five times as long
        rows = np.flatnonzero(depth == d)
        cut[rows] = np.partition(D[rows] if len(rows) < len(D) else D, d - 1, axis=1)[:, d - 1]
    within = cut[:, None] >= D  # exactly the first depth, unless values tied at the cut run past it
    hits = np.count_nonzero(within & wanted, axis=1)
    for r in np.flatnonzero(np.count_nonzero(within, axis=1) > depth):  # crowded at the cut: ties taken by index
        below = D[r] < cut[r]
        at = np.flatnonzero(D[r] == cut[r])[: depth[r] - np.count_nonzero(below)]
        hits[r] = np.count_nonzero(below & wanted[r]) + np.count_nonzero(wanted[r, at])
    out[live] = hits
    return out


def take(G: np.ndarray, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``G[rows][:, columns]``, read as directly as the indices allow: a run of indices is a slice, so a memory map
    reads only those rows' pages, or only that run of each row's columns (a view where both are runs: copy before
    writing); else the entries asked, gathered at once."""
    at_rows, at_columns = _run(rows), _run(columns)
    if isinstance(at_rows, slice):
        return G[at_rows, at_columns]
    if isinstance(at_columns, slice):
        return G[:, at_columns][at_rows]
    return G[np.ix_(at_rows, at_columns)]  # one gather: no copy of the rows whole first


def _run(at: np.ndarray) -> slice | np.ndarray:
    """``at`` as a slice where it is a run of consecutive indices, else itself."""
    if len(at) and at[-1] - at[0] == len(at) - 1 and np.all(np.diff(at) == 1):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


def same_group(groups: np.ndarray, block: np.ndarray, columns: np.ndarray) -> np.ndarray:
    g = groups[block][:, None]
    return (g == groups[columns][None, :]) & (g >= 0)


def nearest_distances(geo: Ranks, rows: np.ndarray, columns: np.ndarray, scaling: str) -> np.ndarray:
    """Each row's distance to its nearest column other than itself (inf when there is none)."""
    out = np.full(len(rows), np.inf)
    if not len(columns):
        return out

    def one(block: np.ndarray) -> np.ndarray:
        return candidates(geo, block, columns, None, scaling).min(axis=1)

    done = 0
    for found in in_order(one, blocks(rows, len(columns))):
        out[done : done + len(found)] = found
        done += len(found)
    return out
