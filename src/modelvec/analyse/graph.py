"""Each model's nearest models as lists, never every pair: what the reports read where a population is too large for its
pairwise products (:mod:`modelvec.store.derived.neighbours` fills them from row blocks streamed from the vector file).

:class:`Nearest` keeps, for every row, its ``depth`` nearest columns by (value, index), from blocks offered in any
order: each block's entries below the row's current cut are appended to a buffer twice the depth, compacted when it
fills. Memory is the rows' depths (twice), whatever the columns: O(n x depth). The lists it gives
(:class:`Lists`) are exactly the first ``depth`` columns a stable sort of each row's whole distances would give: ties
go to the lower index, as everywhere in :mod:`modelvec.analyse.scores`.

The scores read the lists (:mod:`modelvec.analyse.graph_scores`): the kNN dataset score needs each model's k - 1
nearest, k its dataset's size, so a row's depth follows its labels.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: An index that sorts after every column (a slot that holds nothing).
_NONE = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Lists:
    """Each row's nearest columns, nearest first by (value, index): row ``i``'s are ``index[indptr[i]:indptr[i+1]]``
    with their ranking ``value`` and their plain ``distance`` (the same as ``value`` where neighbours are ranked by
    distance)."""

    indptr: np.ndarray
    index: np.ndarray
    value: np.ndarray
    distance: np.ndarray

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row ``i``'s columns, values and distances, nearest first."""
        a, b = self.indptr[i], self.indptr[i + 1]
        return self.index[a:b], self.value[a:b], self.distance[a:b]

    def lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def first(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` nearest as (n, k) columns and distances (-1 and inf where a row holds fewer)."""
        n = len(self)
        index, distance = np.full((n, k), -1, np.int64), np.full((n, k), np.inf)
        take = np.minimum(self.lengths(), k)
        rows = np.repeat(np.arange(n), take)
        at = np.arange(len(rows)) - np.repeat(np.cumsum(take) - take, take)
        source = self.indptr[rows] + at
        index[rows, at], distance[rows, at] = self.index[source], self.distance[source]
        return index, distance

    def subset(self, rows: np.ndarray) -> Lists:
        """The lists of ``rows`` alone, in that order (columns as they are)."""
        rows = np.asarray(rows, np.int64)
        counts = self.lengths()[rows]
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        source = np.repeat(self.indptr[rows], counts) + (np.arange(counts.sum()) - np.repeat(indptr[:-1], counts))
        return Lists(indptr, self.index[source], self.value[source], self.distance[source])

    def placed(self, source: np.ndarray) -> Lists:
        """Lists in a new order of rows: row ``i`` holds what row ``source[i]`` held (nothing where it is -1)."""
        source = np.asarray(source, np.int64)
        counts = (
            np.where(source >= 0, self.lengths()[np.maximum(source, 0)], 0)
            if len(self)
            else np.zeros(len(source), np.int64)
        )
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        start = (
            np.where(source >= 0, self.indptr[np.maximum(source, 0)], 0)
            if len(self)
            else np.zeros(len(source), np.int64)
        )
        at = np.repeat(start, counts) + (np.arange(counts.sum()) - np.repeat(indptr[:-1], counts))
        return Lists(indptr, self.index[at], self.value[at], self.distance[at])

    def remapped(self, position: np.ndarray) -> Lists:
        """The lists with every column ``j`` renamed ``position[j]`` and the columns mapped to -1 dropped (rows are
        unchanged; each row stays sorted where ``position`` keeps the columns' order)."""
        new = np.asarray(position, np.int64)[self.index]
        keep = new >= 0
        owner = np.repeat(np.arange(len(self)), self.lengths())
        counts = np.bincount(owner[keep], minlength=len(self))
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return Lists(indptr, new[keep], self.value[keep], self.distance[keep])


class Nearest:
    """Every row's ``depth`` nearest columns by (value, index), from blocks offered in any order (see the module's
    docstring). ``depths``: per row (0: none kept)."""

    def __init__(self, depths: np.ndarray) -> None:
        self.depth = np.asarray(depths, dtype=np.int64).copy()
        if (self.depth < 0).any():
            raise ValueError("a row's depth is at least 0")
        capacity = 2 * self.depth
        self.start = np.concatenate(([0], np.cumsum(capacity)[:-1])).astype(np.int64)
        self.capacity = capacity
        size = int(capacity.sum())
        self.index = np.full(size, _NONE, np.int64)
        self.value = np.full(size, np.inf)
        self.distance = np.full(size, np.inf)
        self.fill = np.zeros(len(self.depth), np.int64)
        #: per row the (value, index) an entry must come before to be kept: the depth-th nearest held, once held
        self.cut = np.full(len(self.depth), np.inf)
        self.cut_index = np.full(len(self.depth), _NONE, np.int64)

    def __len__(self) -> int:
        return len(self.depth)

    def offer(
        self, rows: np.ndarray, columns: np.ndarray, values: np.ndarray, distances: np.ndarray | None = None
    ) -> None:
        """Offer each of ``rows`` the ``columns`` at ``values`` (len(rows) x len(columns); inf: not a neighbour it
        may have, such as itself) with their plain ``distances`` (default: the values)."""
        rows, columns = np.asarray(rows, np.int64), np.asarray(columns, np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not len(rows) or not len(columns):
            return
        cut, cut_index = self.cut[rows, None], self.cut_index[rows, None]
        take = (values < cut) | ((values == cut) & (columns[None, :] < cut_index))
        take &= np.isfinite(values)
        take &= (self.depth[rows] > 0)[:, None]
        self._thin(take, values, self.depth[rows])
        r, c = np.nonzero(take)
        if not len(r):
            return
        value = values[r, c]
        distance = value if distances is None else np.asarray(distances, dtype=np.float64)[r, c]
        self.add(rows[r], columns[c], value, distance)

    @staticmethod
    def _thin(take: np.ndarray, values: np.ndarray, depth: np.ndarray) -> None:
        """Where a row is offered many more entries than its depth (a streamed row, offered a whole held block), keep
        only those at or below its ``depth``-th smallest value (ties all kept): none of the others can be among its
        nearest, and its buffer takes a few times its depth, not thousands. Rows are taken by depth rounded up to a
        power of two (a handful of partitions)."""
        offered = np.count_nonzero(take, axis=1)
        many = np.flatnonzero(offered > 4 * np.maximum(depth, 1))
        if not len(many):
            return
        width = 1 << np.ceil(np.log2(np.maximum(depth[many], 1))).astype(np.int64)
        for w in np.unique(width):
            at = many[width == w]
            sub = np.where(take[at], values[at], np.inf)
            bound = np.partition(sub, int(w) - 1, axis=1)[:, int(w) - 1]
            take[at] &= values[at] <= bound[:, None]

    def add(self, owner: np.ndarray, columns: np.ndarray, values: np.ndarray, distances: np.ndarray) -> None:
        """Offer each entry (``owner`` row, column, value, distance) to its row: what :meth:`offer` does with the
        entries of a block it keeps, and how lists found apart are merged (their rows' nearest of the union is
        the nearest of their nearest)."""
        owner, columns = np.asarray(owner, np.int64), np.asarray(columns, np.int64)
        if not len(owner):
            return
        keep = (self.depth[owner] > 0) & np.isfinite(values)
        keep &= (values < self.cut[owner]) | ((values == self.cut[owner]) & (columns < self.cut_index[owner]))
        owner, columns, values, distances = owner[keep], columns[keep], values[keep], distances[keep]
        if not len(owner):
            return
        order = np.argsort(owner, kind="stable")
        owner, columns, values, distances = owner[order], columns[order], values[order], distances[order]
        rows, counts = np.unique(owner, return_counts=True)
        over = rows[self.fill[rows] + counts > self.capacity[rows]]
        if len(over):  # rows whose buffer would overflow: compacted with what they are offered now
            self._compact(over, (owner, columns, values, distances))
            keep = ~np.isin(owner, over)
            owner, columns, values, distances = owner[keep], columns[keep], values[keep], distances[keep]
            rows, counts = np.unique(owner, return_counts=True)
        if not len(owner):
            return
        first = np.repeat(np.cumsum(counts) - counts, counts)
        at = self.start[owner] + self.fill[owner] + (np.arange(len(owner)) - first)
        self.index[at], self.value[at], self.distance[at] = columns, values, distances
        self.fill[rows] += counts

    def _compact(self, rows: np.ndarray, offered: tuple[np.ndarray, ...] | None = None) -> None:
        """Keep only each row's ``depth`` nearest of its buffer (and of ``offered``: (rows, columns, values,
        distances) entries for these rows), sorted, and move its cut to the last of them."""
        rows = np.unique(rows)
        mine, cols, vals, dists = offered if offered is not None else (np.zeros(0, np.int64),) * 4
        sel = np.isin(mine, rows)
        mine, cols, vals, dists = mine[sel], cols[sel], vals[sel], dists[sel]
        fill = self.fill[rows]
        # every row's buffer, then its offered entries, as one flat list grouped by row
        owner = np.concatenate((np.repeat(rows, fill), mine))
        slot = np.repeat(self.start[rows], fill) + (np.arange(fill.sum()) - np.repeat(np.cumsum(fill) - fill, fill))
        idx = np.concatenate((self.index[slot], cols))
        val = np.concatenate((self.value[slot], vals))
        dst = np.concatenate((self.distance[slot], dists))
        order = np.lexsort((idx, val, owner))
        owner, idx, val, dst = owner[order], idx[order], val[order], dst[order]
        firsts = np.searchsorted(owner, rows)
        counts = np.searchsorted(owner, rows, side="right") - firsts
        keep = np.minimum(counts, self.depth[rows])
        rank = np.arange(len(owner)) - np.repeat(firsts, counts)
        kept = rank < np.repeat(keep, counts)
        owner, idx, val, dst, rank = owner[kept], idx[kept], val[kept], dst[kept], rank[kept]
        at = self.start[owner] + rank
        self.index[at], self.value[at], self.distance[at] = idx, val, dst
        self.fill[rows] = keep
        full = keep == self.depth[rows]
        last = self.start[rows] + keep - 1
        self.cut[rows[full]] = self.value[last[full]]
        self.cut_index[rows[full]] = self.index[last[full]]

    def hold(self, lists: Lists, rows: np.ndarray) -> None:
        """Start each of ``rows`` (none offered anything yet) from its nearest in ``lists`` (sorted, as
        :meth:`lists` gives them; at most its depth kept)."""
        rows = np.asarray(rows, np.int64)
        counts = np.minimum(lists.lengths()[rows], self.depth[rows])
        source = np.repeat(lists.indptr[rows], counts) + (
            np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        )
        owner = np.repeat(rows, counts)
        rank = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
        at = self.start[owner] + rank
        self.index[at], self.value[at], self.distance[at] = (
            lists.index[source],
            lists.value[source],
            lists.distance[source],
        )
        self.fill[rows] = counts
        full = rows[counts == self.depth[rows]]
        last = self.start[full] + self.depth[full] - 1
        self.cut[full], self.cut_index[full] = self.value[last], self.index[last]

    def lists(self) -> Lists:
        """Every row's nearest, nearest first (the buffers compacted)."""
        busy = np.flatnonzero(self.fill > 0)
        if len(busy):
            self._compact(busy)
        counts = self.fill
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        slot = np.repeat(self.start, counts) + (np.arange(counts.sum()) - np.repeat(indptr[:-1], counts))
        return Lists(indptr, self.index[slot].copy(), self.value[slot].copy(), self.distance[slot].copy())


def nearest_rows(rows: np.ndarray, depth: int, *, block: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``depth`` nearest other rows by euclidean distance and its ``depth`` nearest by cosine, merged
    (n x 2 depth, -1 where fewer), with their inner products (float64, from the float32 rows' products), from the
    rows' products a block at a time, each pair once: what a model's parents are looked for among where every pair
    would be too many (the model tree of tens of thousands of traces). Memory: a block of products (``block`` x n)
    and the lists, beside the rows."""
    t = np.ascontiguousarray(rows, dtype=np.float32)
    n = len(t)
    squares = np.einsum("ij,ij->i", t, t, dtype=np.float64)
    norms = np.sqrt(squares)
    inverse = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    near, along = Nearest(np.full(n, min(depth, n - 1))), Nearest(np.full(n, min(depth, n - 1)))
    for a0 in range(0, n, block):
        a1 = min(n, a0 + block)
        P = (t[a0:a1] @ t[a0:].T).astype(np.float64)  # this block against itself and every row after it
        cols = np.arange(a0, n)
        mine = np.arange(a0, a1)
        D = np.sqrt(np.maximum(squares[mine, None] + squares[None, a0:] - 2 * P, 0.0))
        C = 1.0 - P * np.multiply.outer(inverse[mine], inverse[a0:])
        for V, nb in ((D, near), (C, along)):
            V[np.arange(a1 - a0), np.arange(a1 - a0)] = np.inf  # itself
            nb.offer(mine, cols, V, P)  # the product kept as the entry's "distance": what the tree asks
            if a1 < n:  # the other side of the pairs beyond the block (its own square holds both)
                nb.offer(cols[a1 - a0 :], mine, V[:, a1 - a0 :].T, P[:, a1 - a0 :].T)
    index, dots = np.full((n, 2 * depth), -1, np.int64), np.zeros((n, 2 * depth))
    for k, nb in enumerate((near, along)):
        index[:, k * depth : (k + 1) * depth], dots[:, k * depth : (k + 1) * depth] = nb.lists().first(depth)
    dots[index < 0] = 0.0
    return index, dots


@dataclass(frozen=True)
class Searched:
    """What :func:`search` found: the nearest it reached (positions, their exact distances, nearest first) and how
    many rows it computed a distance for."""

    order: np.ndarray
    values: np.ndarray
    computed: int


def search(
    lists: list[Lists],
    distances: Callable[[np.ndarray], np.ndarray],
    entries: np.ndarray,
    *,
    width: int,
    batch: int = 4,
) -> Searched:
    """A query's nearest rows found by walking the rows' nearest lists (an HNSW layer's best-first search on the
    kept graph): from the ``entries``, the ``batch`` nearest rows not yet expanded are expanded together (their
    lists' columns not yet seen get their exact ``distances(columns)``, one call) until the nearest unexpanded row is
    farther than the ``width``-th nearest found. Every distance is exact; what a row's lists never lead to is not
    found (its recall is measured: ``bench/bench_search.py``). A row whose distance is not finite is not kept."""
    seen = np.zeros(len(lists[0]), dtype=bool)
    entries = np.unique(np.asarray(entries, dtype=np.int64))
    seen[entries] = True
    d = distances(entries)
    frontier = [(float(v), int(i)) for v, i in zip(d, entries) if np.isfinite(v)]
    heapq.heapify(frontier)
    best = sorted(frontier)[:width]  # the ``width`` nearest found, as (distance, row)
    computed = len(entries)
    while frontier:
        worst = best[-1][0] if len(best) >= width else np.inf
        take = [heapq.heappop(frontier) for _ in range(min(batch, len(frontier)))]
        take = [t for t in take if t[0] <= worst]
        if not take:
            break
        rows = [t[1] for t in take]
        cols = np.unique(np.concatenate([lst.row(r)[0] for lst in lists for r in rows]))
        cols = cols[~seen[cols]]
        if not len(cols):
            continue
        seen[cols] = True
        computed += len(cols)
        for v, j in zip(distances(cols), cols.tolist()):
            if np.isfinite(v) and (len(best) < width or v < best[-1][0]):
                heapq.heappush(frontier, (float(v), j))
                bisect.insort(best, (float(v), j))
                del best[width:]
    order = np.array([j for _, j in best], dtype=np.int64)
    return Searched(order, np.array([v for v, _ in best]), computed)
